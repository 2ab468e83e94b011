"""Choosing a query's row cap per privacy unit (contribution = "auto"), jointly with the clipping
bounds of its summed columns (clipping = "auto", ``mechanisms.clip_bounds``).

The cap k trades bias against noise.  Rows a unit has beyond k are dropped, which biases every
total (COUNT, SUM) down, while every noisy measurement's sensitivity, hence its noise, grows
linearly with k.  A fixed table-wide cap is wrong for most queries: too small, and COUNT(*) comes
back far too low at any epsilon; too large, and an AVG drowns in noise it did not need.

The histogram.  In the database, count each unit's rows in the query's own filtered relation,
c_u, and count units per bin of c_u.  The bins partition [1, limit]: one bin per integer up to 8,
then bins about 19% wide (edges grow by a factor 2^(1/4)), and a bin for exactly the limit (it
also holds units with more rows than the limit: at any cap <= limit they count as the limit).
Each unit falls in exactly one bin, so adding or removing a unit changes one count by 1: L1
sensitivity 1.  Discrete Laplace noise of scale 1 / epsilon_h makes the histogram epsilon_h-DP.
k (and the bounds) are functions of the noisy histograms only (post-processing), so the query
costs the epsilons of its histograms plus those of its measurements, by basic composition.

Estimates.  Every estimate reads H'_b, the noisy counts made consistent (``mechanisms.consistency``:
the closest non-negative counts whose tail sums, the units with at least s_b rows, are
monotone; post-processing, free).  The raw counts are not read: an empty bin's count is
negative half of the time, and at a small epsilon_h the sum of a few bins' noise is larger
than the rows themselves, so the total went to 0 or below and every relative error of the rule
saturated (the cap then jumped to 1 or to the limit from run to run).  A unit of bin b is
taken to have m_b rows, the middle of the bin [s_b, e_b] (e_b the next start minus 1; the
limit bin: exactly the limit).  Then the rows kept at cap k, and the rows lost,

    N(k) = N(limit) - R(k),    N(limit) = sum_b H'_b m_b,    R(k) = sum_b H'_b max(0, m_b - k),

with sd R(k) = sqrt(V sum_b max(0, m_b - k)^2) and sd N(limit) = sqrt(V sum_b m_b^2), V =
2a / (1 - a)^2, a = exp(-epsilon_h), the variance of discrete Laplace noise of sensitivity 1
(about 2 / epsilon_h^2 for small epsilon_h).  (These are the raw counts' standard deviations:
the consistent fit is a projection onto a convex set containing the truth, which moves no
estimate further from the truth in the fit's norm; the raw ones are the conservative choice.)

The test.  The rows above a small cap and the values beyond a narrow bound are invisible in
the answer (pure bias), while a too large cap or a too wide bound only shows up as noise, whose
size is known.  So a narrower choice must win by more than its estimates' noise: every
estimate that argues for narrowing is taken at its one-sided 95% confidence limit (Z = 1.645
standard deviations of the histogram noise, ``mechanisms.clip_bounds.Z``):

    bias of a total at cap k    L(k) = R(k) + Z sd R(k)                      (upper)
    clipping bias at bound B    loss(B) + Z sd loss(B), spread_loss + Z sd   (upper)
    scale of a total's noise    N_+ = N(limit) + Z sd N(limit)               (upper)
    mean magnitude              mu_+ = mu + Z sd mu                          (upper)

and the rule minimises E at these values.  The default choice D, the largest candidate cap
(the limit unless the cap is fixed) with the declared bounds, has no bias (R(limit) = 0,
loss(M) = 0, both standard deviations 0), so a choice c != D wins only if

    E_Z(D) - E_Z(c) = (noise(D) - noise(c)) / scale_+ - bias_+(c) > 0,

i.e. if the gain's lower 95% confidence limit is positive (for one total, whose bias and noise
share the scale: the noise saved, in rows, exceeds L(k)); otherwise D stands.  No bias is capped
at 1: an upper estimate above 100% says the histogram cannot tell, and capping it made every
narrowed bound tie, the least noisy (narrowest) then winning.  An underestimated scale (the
rows, mu) makes every noise look large and argues for the narrowest choice, hence the upper
scales.  A ratio's noise (AVG, VARIANCE) is divided by the point estimate N(k): a smaller cap
moves a ratio only through which rows are kept (the subsampling term below), not by a missing
share of a total.  But the part of a ratio's noise that a narrower bound saves is divided by
N_+(k) = N(k) + Z sd N(k), sd N(k) = sqrt(V sum_b min(m_b, k)^2): a cap histogram that is all
noise (N(k) near 0) must not make the declared bound's noise look unbounded (it did: AVG(cost)
clipped to [0, 4.88]).  A clipped column whose histogram does not show values at all (A - Z sd A
<= 0, A = sum_j H'_j a_j, ``ClipColumn.measured``) keeps its declared bound.
``Choice.noise_dominated`` records that the test overruled the point estimates (Z = 0): D was
taken although the plug-in rule preferred a narrower choice; such a choice is not stored for
reuse (the engine's choice_reuse_seconds), so an identical query looks again.  At a small
selection epsilon this keeps the limit and the declared bounds: the error of the declared
choice plus the selection's share, never a wrecked answer.  Candidates: every bin start,
every bin end, the limit.

What the test costs.  For one total of weight w (1 for a COUNT), E_Z(k) - E_Z(limit) >=
(limit - k) (Z sqrt(V) - sqrt(2) w / epsilon_m) / scale_+, since sd R(k) >= sqrt(V) (limit - k)
(the limit bin alone).  So when Z sqrt(V) > sqrt(2) w / epsilon_m, roughly epsilon_h < Z
epsilon_m / w, whatever the histogram shows, a total keeps the limit: one unit hidden in the
limit bin would cost as many rows as the whole noise saving, and the histogram cannot rule it
out.  With the default selection share (privacy.cap_epsilon_share = 0.1, epsilon_h <= epsilon /
10 against epsilon_m = 0.9 epsilon) that always holds: a COUNT or SUM released as a total is
answered at the limit, and only ratios and clipping bounds move.  A larger share is the way to
let a total's cap move on evidence.  Where this holds for every term (``limit_is_certain``, exact
for the discrete Laplace variance, from the query's public shape and epsilons alone) the engine
runs no cap histogram: the choice is known, and the selection's share goes to the answer.

The rule.  For a query with G groups (its public keys; 1 otherwise) let n_k = N(k) / G and
n = N(limit) / G, the rows per group.  A measurement m of epsilon_m at cap k has Laplace-type
noise of standard deviation sqrt(2) k d_m / epsilon_m, d_m its per-row bound.  Its expected
relative error is taken as

    COUNT released as a total:  e = L(k) / (G n_+) + sqrt(2) k / epsilon_m / n_+
    SUM released as a total:    e = L(k) / (G n_+) + L(B) + sqrt(2) k d_m(B) / epsilon_m
                                    / (n_+ mu_+)
    AVG, c + S / N:             e = L(B) + sqrt(2) k sqrt((h / eps_S)^2 + (s / eps_N)^2)
                                        / (n_k mu_+)
                                    + cv(B) sqrt(max(0, 1 / n_k - 1 / n))
    VARIANCE, (Q - S^2 / N) / (N - 1):
                                e = sqrt(2) k sqrt((q / eps_Q)^2 + (2 s h / eps_S)^2
                                                   + ((s^2 - nu(B)) / eps_N)^2) / (n_k nu(B))
                                    + (nu(M) - nu(B)) / nu(M)  (upper estimate)
                                    + sqrt(kappa(B) - 1) sqrt(max(0, 1 / n_k - 1 / n))

with n_+ = N_+ / G, mu_+, nu(B) and L(B) = loss(B) at its upper estimate from the column's
histogram (``mechanisms.clip_bounds``; the noise a narrower bound saves in an AVG or a VARIANCE
divided by n_k N_+(k) / N(k) instead of n_k, as above) and d_m(B) the per-row bound at the
magnitude bound B.  An AVG or a VARIANCE measures S, the sum of x - c (c = (l' + u') / 2, the
middle of the interval; 0 for a symmetric one), N, the count, and for a VARIANCE Q, the sum of
(x - c)^2; h = d_S(B) and q = d_Q(B) are their per-row bounds ((u' - l') / 2 and its square
when centred) and s = s(B) = |E[x] - c| (``ClipColumn.offset``).

The ratios' noise, to first order (the delta method).  With S = S_0 + X_S, N = N_0 + X_N,
Q = Q_0 + X_Q, the noises X_m independent with sd_m = sqrt(2) k d_m / epsilon_m (N_0 = n_k,
S_0 = (mean - c) N_0):

    c + S / N                 moves by  (X_S - (mean - c) X_N) / N_0
    (Q - S^2 / N) / (N - 1)   moves by  (X_Q - 2 (mean - c) X_S + ((mean - c)^2 - var) X_N)
                                        / (N_0 - 1)

(d/dN of (Q - S^2 / N) / (N - 1) is (S^2 / N^2 - var) / (N - 1)), whose standard deviations
are the square roots above, taken relative to the mean magnitude mu and to the spread nu(B).
The count's noise reaches an AVG only times s.  Weighed one measurement at a time (as this rule
did before), the count of a clipped column looked like a sum of per-row bound max(|l'|, |u'|)
and every part of a VARIANCE was added up as an error of its own: for fare in [0, 200] (mean
21, variance 256, s = 79) the AVG's count was charged 200 / 79 = 2.5 times its noise, and the
VARIANCE's noise came out at (100 + 200) / 21 + 100^2 / 256 = 53 per sqrt(2) k / (eps n_k)
where it is sqrt(100^4 + (2 * 79 * 100)^2 + (79^2 - 256)^2) / 256 = 77: STDDEV(fare) got caps
above its best.
A measurement a caller leaves out of the terms adds no noise (1 / eps = 0).  An AVG next to a
VARIANCE of the same column shares its S and N; the rule weighs the VARIANCE.  A column whose
bounds are fixed has no histogram and its measurements are weighed one by one: COUNT inside a
ratio e = sqrt(2) k / epsilon_m / n_k, sums d_m / mu = w_m = 2 (a per-row bound taken as
twice a typical value), loss 0 and cv 1, as in the SUM and AVG lines.
The subsampling term cv sqrt(1/n_k - 1/n) is the relative standard deviation of a mean over n_k
rows drawn at random without replacement from n (finite-population correction), cv = the
coefficient of variation sqrt(nu(B)) / mu(B): an average over a small cap sees few rows of each
unit, and its answer moves with the rows drawn even without noise.  A variance over those rows
moves the same way, with sqrt(kappa - 1) in place of cv (the relative variance of a sample
variance is (kappa - 1) / n, kappa the kurtosis of the clipped values).  The spread term
(nu(M) - nu(B)) / nu(M) is the variance's clipping bias: a VARIANCE of values clipped at B
estimates nu(B), and clipping the tail removes spread much faster than it moves the mean
(without it, the rule narrowed the bounds of STDDEV(fare) to half the declared ones and lost
up to 7x the accuracy of a fixed cap).

Groups per unit.  A query whose group keys are released by thresholding also bounds the
distinct groups per unit, g, from a third histogram (distinct groups per unit, same bins,
sensitivity 1), chosen first and on its own by ``choose_groups`` (a DP quantile, derived
there).  The key-release threshold then depends on g, not k, so the cap rule leaves the
key-release count out (its weight is 0) and trades rows against the measurements' noise alone.

k minimises E(k), the sum of these errors over the query's outputs, where for each clipped
column the bound B minimises the part of E(k) that depends on it (its measurements' terms)
among its candidates; the smallest k and the widest B win ties.  On data where every unit has
exactly c rows (c a bin start and end, c <= 8) a total's error falls until k = c and rises
after it, so the rule picks c when the histogram noise is small.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from mechanisms.clip_bounds import ClipColumn, SumKind, Z
from mechanisms.consistency import consistent_counts
from mechanisms.thresholding import key_release_threshold


@dataclass(frozen=True)
class CapTerm:
    """One noisy measurement as the rule sees it.

    ``column`` is the index (in the rule's ``columns``) of the clipped expression it sums when
    that expression's bound is chosen too; then ``weight`` is unused and ``kind``/``centred``
    say how its per-row bound follows from the interval.
    """

    weight: float     # w_m: 1 for counts, 2 for sums with fixed bounds, 0 when k does not matter
    epsilon: float    # its epsilon
    total: bool       # released as a total (its bias counts) or only inside a ratio
    column: int | None = None
    kind: Literal["count", "sum", "sum_squares"] = "count"
    centred: bool = False


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


def discrete_laplace_variance(epsilon: float) -> float:
    """Var X = 2a / (1 - a)^2, a = exp(-epsilon), for discrete Laplace noise of sensitivity 1.

    About 2 / epsilon^2 for small epsilon, far less for large epsilon (the noise is then 0
    almost always), which lets a generous histogram show clearly that a bin is empty.

    >>> round(discrete_laplace_variance(0.1), 1), round(discrete_laplace_variance(20.0), 12)
    (199.8, 4.122e-09)
    """
    if not epsilon > 0:
        raise ValueError("epsilon must be positive")
    return 2.0 * math.exp(-epsilon) / math.expm1(-epsilon) ** 2


@dataclass(frozen=True)
class RowModel:
    """Rows per unit from the noisy cap histogram (see the module docstring).

    ``noisy`` holds the histogram as released; every estimate reads its consistent version
    (``mechanisms.consistency``: non-negative counts with monotone tail sums).  ``epsilon`` is
    the histogram's epsilon_h (0: the counts are exact, no uncertainty).
    """

    starts: tuple[int, ...]
    noisy: tuple[float, ...]
    limit: int
    epsilon: float

    def __post_init__(self) -> None:
        if len(self.starts) != len(self.noisy):
            raise ValueError("one count per bin")
        if any(s > self.limit for s in self.starts):
            raise ValueError("bins start at most at the limit")

    @classmethod
    def exact_rows(cls, rows: float) -> RowModel:
        """One row per unit and ``rows`` units (event-level tables: cap 1, nothing lost)."""
        return cls((1,), (float(rows),), 1, 0.0)

    @functools.cached_property
    def _middles(self) -> np.ndarray:
        """m_b: the middle of each bin (the limit bin: exactly the limit)."""
        ends = [*(s - 1 for s in self.starts[1:]), self.limit]
        return np.array([(s + e) / 2 for s, e in zip(self.starts, ends, strict=True)])

    @functools.cached_property
    def _counts(self) -> np.ndarray:
        """H': the consistent counts (non-negative, monotone tail sums)."""
        return consistent_counts(self.noisy)

    @functools.cached_property
    def variance(self) -> float:
        """V, the variance of one bin's noise (0 for exact counts)."""
        return discrete_laplace_variance(self.epsilon) if self.epsilon > 0 else 0.0

    def counts(self) -> tuple[float, ...]:
        """H'_b, the consistent counts every estimate reads."""
        return tuple(float(c) for c in self._counts)

    def candidates(self) -> list[int]:
        """Bin starts, bin ends and the limit, ascending."""
        ends = [s - 1 for s in self.starts[1:]]
        return sorted({*self.starts, *ends, self.limit} - {0})

    def all_rows(self) -> float:
        """N(limit) = sum_b H'_b m_b, at least 1."""
        return max(float(np.dot(self._counts, self._middles)), 1.0)

    def all_rows_sd(self) -> float:
        """sd N(limit) = sqrt(V sum_b m_b^2)."""
        return math.sqrt(self.variance * float(np.dot(self._middles, self._middles)))

    def _above(self, caps: np.ndarray) -> np.ndarray:
        """max(0, m_b - k) for every cap k (rows) and bin b (columns)."""
        return np.maximum(self._middles[None, :] - caps[:, None], 0.0)

    def lost_at(self, caps: np.ndarray, z: float = Z) -> np.ndarray:
        """L(k) = R(k) + z sd R(k) at every cap: rows lost above k, upper estimate."""
        above = self._above(caps)
        found = above @ self._counts
        if self.variance > 0 and z:
            found = found + z * np.sqrt(self.variance * np.sum(above * above, axis=1))
        return found

    def kept_at(self, caps: np.ndarray) -> np.ndarray:
        """N(k) = N(limit) - R(k) at every cap, at least 1."""
        return np.maximum(self.all_rows() - self._above(caps) @ self._counts, 1.0)

    def kept_upper_at(self, caps: np.ndarray, z: float = Z) -> np.ndarray:
        """N(k) + z sd N(k), sd N(k) = sqrt(V sum_b min(m_b, k)^2): the rows at cap k at their
        upper estimate (the scale a narrower bound's noise saving is divided by)."""
        kept = self.kept_at(caps)
        if self.variance > 0 and z:
            within = np.minimum(self._middles[None, :], caps[:, None])
            kept = kept + z * np.sqrt(self.variance * np.sum(within * within, axis=1))
        return kept

    def lost(self, k: int, z: float = Z) -> float:
        """L(k) at one cap (``lost_at``)."""
        return float(self.lost_at(np.array([float(k)]), z)[0])

    def kept(self, k: int) -> float:
        """N(k) at one cap (``kept_at``)."""
        return float(self.kept_at(np.array([float(k)]))[0])


def soft_threshold(rows: RowModel) -> RowModel:
    """The histogram with each consistent count shrunk by twice its noise's standard deviation,
    H''_b = max(0, H'_b - 2 sqrt(V)) (derived in ``mechanisms.quantile_cap``, whose rule reads
    rows per unit from it, as ``choose_groups_checked`` reads groups per unit); non-negative,
    hence consistent: read as exact counts (epsilon 0).

    >>> shrunk = soft_threshold(RowModel((1, 2, 3), (100.0, 5.0, 0.0), 3, 1.0))  # 2 sd = 2.71
    >>> [round(c, 2) for c in shrunk.counts()], shrunk.epsilon
    ([97.29, 2.29, 0.0], 0.0)
    """
    margin = 2.0 * math.sqrt(rows.variance)
    return RowModel(rows.starts, tuple(max(0.0, c - margin) for c in rows.counts()),
                    rows.limit, 0.0)


def limit_is_certain(terms: Sequence[CapTerm], epsilon_h: float, groups: int = 1) -> bool:
    """Whether :func:`choose`, given a cap histogram of ``epsilon_h`` and no clipped column,
    returns the limit whatever the histogram holds, so running it would buy nothing.

    Each term of a total (``column`` None) adds L(k) / (G scale) + w sqrt(2) k / (epsilon_m
    scale) to E(k) (``_best``), and L(k) = R(k) + Z sd R(k) >= Z sqrt(V) (limit - k), since R(k)
    >= 0 (consistent counts) and the limit bin alone puts (limit - k)^2 V in Var R(k);
    L(limit) = 0.  So every such term makes E(k) - E(limit) >= (limit - k) (Z sqrt(V) / G -
    w sqrt(2) / epsilon_m) / scale, which is > 0 for every k < limit when

        Z sqrt(V) / G > w sqrt(2) / epsilon_m      for every term,

    and then the limit, the only candidate with E(k) <= E(limit), wins strictly.  A ratio
    (``total`` False) or a clipped column can favour a smaller cap: never certain then.  The
    condition reads only epsilons, weights and G: public, like the query itself.
    """
    if not terms or any(t.column is not None or not t.total for t in terms):
        return False
    if any(not t.epsilon > 0 for t in terms) or not epsilon_h > 0:
        raise ValueError("epsilons must be positive")
    spread = Z * math.sqrt(discrete_laplace_variance(epsilon_h)) / max(groups, 1)
    return all(spread > t.weight * math.sqrt(2.0) / t.epsilon for t in terms)


@dataclass(frozen=True)
class Choice:
    """The chosen cap, the magnitude bound of every clipped column, and E at that choice.

    ``noise_dominated`` says the choice fell back: it is the default (the largest candidate
    cap, normally the limit, and the declared bounds) only because the test of the module
    docstring rejected the narrower choice the point estimates preferred, or because a
    histogram showed no measurable rows.  The histograms then said nothing reliable: such a
    choice is safe to use once but must not be stored for reuse (an identical query should
    look again).  False when a narrower choice passed the test, or when the point estimates
    themselves prefer the default (evidence that it is best).
    """

    cap: int
    bounds: tuple[float, ...]
    error: float
    noise_dominated: bool = False


def choose(rows: RowModel, terms: Sequence[CapTerm], columns: Sequence[ClipColumn] = (),
           groups: int = 1, caps: Sequence[int] | None = None) -> Choice:
    """Minimise E(k) jointly over the cap and the columns' bounds, with every bias at its
    upper estimate and every noise scale at its upper estimate (module docstring, "The test").

    ``caps`` restricts the candidate caps (a fixed cap: just that one); every candidate above
    ``rows.limit`` is dropped, so the result never exceeds it.  The default choice is the
    largest candidate cap with the declared bounds.
    """
    if any(not t.epsilon > 0 for t in terms):
        raise ValueError("epsilons must be positive")
    if any(t.column is not None and not 0 <= t.column < len(columns) for t in terms):
        raise ValueError("a term names a column that was not given")
    groups = max(groups, 1)
    wanted = rows.candidates() if caps is None else sorted(set(caps))
    candidates = [k for k in wanted if 1 <= k <= rows.limit]
    if not candidates:
        raise ValueError("no candidate cap within the limit")
    # Every statistic of a bound is independent of the cap: tabulate them once per column.
    tables = [(column, [t for t in terms if t.column == index], _BoundTable(column))
              for index, column in enumerate(columns)]
    ks = np.asarray(candidates, dtype=float)
    tested = _best(rows, terms, tables, groups, ks, Z)
    default = (len(ks) - 1, tuple(t.bounds[0] for _, _, t in tables))
    noise_dominated = False
    if (tested[0], tested[1]) == default:
        # Did the test overrule the point estimates?  Then the histograms were too noisy to
        # act on, and the choice fell back.
        point = _best(rows, terms, tables, groups, ks, 0.0)
        noise_dominated = (point[0], point[1]) != default
    best, bounds, error = tested
    return Choice(candidates[best], bounds, error, noise_dominated)


def _best(rows: RowModel, terms: Sequence[CapTerm],
          tables: Sequence[tuple[ClipColumn, list[CapTerm], _BoundTable]], groups: int,
          ks: np.ndarray, z: float) -> tuple[int, tuple[float, ...], float]:
    """(index of the best cap, its bounds, its E) with uncertain estimates taken z standard
    deviations on the side that argues against narrowing (z = 0: point estimates)."""
    # E(k) at every candidate at once: arrays over k (and over k x B for the bounds).
    n_all = rows.all_rows() / groups
    # The scale of every total's noise and bias, at its upper estimate: a total's bias and
    # noise share it, so their comparison does not depend on it, while an underestimated
    # scale would make every noise look large and argue for the smallest cap.
    scale = (rows.all_rows() + z * rows.all_rows_sd()) / groups
    n_k = rows.kept_at(ks) / groups
    # The ratio of the point to the upper estimate of the rows at k: a ratio's noise saved by
    # a narrower bound is scaled by it (_BoundTable.errors).
    shrink = n_k / (rows.kept_upper_at(ks, z) / groups)
    bias = rows.lost_at(ks, z) / groups / scale
    # Rows per group a mean over cap k leaves out, as a relative standard deviation / cv.
    subsample = np.sqrt(np.maximum(0.0, 1.0 / n_k - 1.0 / n_all))
    root2k = math.sqrt(2.0) * ks
    error = np.zeros(len(ks))
    for term in terms:
        if term.column is not None:
            if term.kind == "count" and term.total:
                # COUNT(x) released next to an AVG(x): its noise and loss do not depend on x's
                # bound (inside the ratio, _BoundTable weighs its noise).
                error += bias + term.weight * root2k / term.epsilon / scale
            elif term.total:
                error += bias
            continue
        noise = term.weight * root2k / term.epsilon
        if term.total:
            error += bias + noise / scale
        else:
            error += noise / n_k
            if term.kind == "sum":
                error += subsample  # cv = 1 without a histogram of the values
    bounds = np.empty((len(ks), len(tables)))
    rows_k = np.arange(len(ks))
    for index, (column, mine, table) in enumerate(tables):
        part = table.errors(mine, ks[:, None], n_k[:, None], scale, subsample[:, None], z,
                            shrink[:, None])
        # At every k the first (largest) bound of least error, as a scan with a strict "<".
        at = np.argmin(part, axis=1)
        least = part[rows_k, at]
        finite = least < math.inf
        bounds[:, index] = np.where(finite, table.bounds[at], column.magnitude)
        if mine:
            error += np.where(finite, least, math.inf)
    # The first k of least error (the smallest, as a scan with a strict "<" finds it); an
    # undefined error never wins.
    best = int(np.argmin(np.where(np.isnan(error), math.inf, error)))
    return best, tuple(float(b) for b in bounds[best]), float(error[best])


class _BoundTable:
    """A column's candidate bounds B and the statistics the rule needs at each, as arrays.

    ``errors`` evaluates the terms of E(k) that depend on B (module docstring) at every k and B
    at once.
    """

    def __init__(self, column: ClipColumn) -> None:
        self.column = column
        self.bounds = bounds = np.asarray(column.candidates(), dtype=float)
        # Every statistic at every bound in one array operation (``ClipColumn.means`` and
        # the others).
        self.spread = column.spreads(bounds)
        self.spread_loss = column.spread_losses(bounds)
        self.spread_loss_sd = column.spread_loss_sds(bounds)
        self.kurtosis_term = np.sqrt(np.maximum(column.kurtoses(bounds) - 1.0, 0.0))
        self.loss = column.losses(bounds)
        self.loss_sd = column.loss_sds(bounds)
        self.cv = np.sqrt(self.spread) / column.means(bounds)
        self._per_row: dict[tuple[str, bool], np.ndarray] = {}
        self._offset: dict[bool, np.ndarray] = {}

    def per_row(self, kind: SumKind, centred: bool) -> np.ndarray:
        found = self._per_row.get((kind, centred))
        if found is None:
            found = self._per_row[(kind, centred)] = np.asarray(
                [self.column.per_row(b, kind, centred) for b in self.bounds.tolist()])
        return found

    def offset(self, centred: bool) -> np.ndarray:
        found = self._offset.get(centred)
        if found is None:
            found = self._offset[centred] = self.column.offsets(self.bounds, centred)
        return found

    def errors(self, terms: Sequence[CapTerm], k: np.ndarray, n_k: np.ndarray, n_all: float,
               subsample: np.ndarray, z: float = Z, shrink: np.ndarray | None = None
               ) -> np.ndarray:
        """The errors at every cap (``k``, ``n_k``, ``subsample`` and ``shrink``: one row per
        cap, shape (K, 1)) and every bound (columns): shape (K, B).  Biases are taken at their
        estimate plus z standard deviations, the mean magnitude mu (the scale of the noise)
        likewise, and a ratio's noise saved by a bound narrower than the declared one is
        multiplied by ``shrink`` = N(k) / (N(k) + z sd N(k)) (module docstring, "The test");
        without measurable values (``ClipColumn.measured``) only the declared bound competes.
        """
        mu = self.column.mean() + z * self.column.mean_sd()
        loss = self.loss + z * self.loss_sd
        spread_loss = self.spread_loss + z * self.spread_loss_sd
        error = np.zeros((len(k), len(self.bounds)))
        if z and not self.column.measured(z):
            error[:, 1:] = math.inf
        root2k = math.sqrt(2.0) * k
        sums = [t for t in terms if t.kind == "sum"]
        counts = [t for t in terms if t.kind == "count"]
        squares = [t for t in terms if t.kind == "sum_squares"]
        for term in sums:
            if term.total:
                noise = root2k * self.per_row("sum", term.centred) / term.epsilon
                error += loss + noise / (n_all * mu)
        if not squares and all(t.total for t in sums + counts):
            return error  # no AVG or VARIANCE of this column
        # The ratio's measurements (module docstring, "AVG and VARIANCE"): its sum S (the
        # centred one; the released SUM when the interval is symmetric, c = 0), its count N and
        # its sum of squares Q.  One the caller did not give adds no noise (its 1 / eps is 0).
        ratio_sum = next((t for t in sums if not t.total), sums[0] if sums else None)
        centred = (ratio_sum.centred if ratio_sum is not None
                   else squares[0].centred if squares else False)
        per_s = 0.0 if ratio_sum is None else 1.0 / ratio_sum.epsilon
        per_n = 0.0 if not counts else 1.0 / counts[0].epsilon
        h = self.per_row("sum", centred)
        s = self.offset(centred)
        if squares:
            # sd of (Q - S^2 / N) / (N - 1) to first order: sqrt(sd_Q^2 + (2 s sd_S)^2 +
            # ((s^2 - nu) sd_N)^2) / n_k, relative to nu(B); sd_m = sqrt(2) k d_m / eps_m.
            q = self.per_row("sum_squares", squares[0].centred) / squares[0].epsilon
            noise = root2k * np.sqrt(q * q + (2.0 * s * h * per_s) ** 2
                                     + ((s * s - self.spread) * per_n) ** 2)
            error += (_saved_at_upper(noise / (n_k * self.spread), shrink) + spread_loss
                      + self.kurtosis_term * subsample)
        else:
            # sd of c + S / N to first order: sqrt(sd_S^2 + (s sd_N)^2) / n_k, relative to mu.
            noise = root2k * np.sqrt((h * per_s) ** 2 + (s * per_n) ** 2)
            error += (loss + _saved_at_upper(noise / (n_k * mu), shrink)
                      + self.cv * subsample)
        return error


def _saved_at_upper(relative: np.ndarray, shrink: np.ndarray | None) -> np.ndarray:
    """A ratio's relative noise at every (cap, bound), the part a bound saves against the
    declared one (column 0) multiplied by ``shrink`` <= 1: the saving at its lower estimate,
    as if the rows were at their upper estimate; a bound that adds noise keeps all of it."""
    if shrink is None:
        return relative
    declared = relative[:, :1]
    change = relative - declared
    return declared + np.maximum(change, 0.0) + np.minimum(change, 0.0) * shrink


def choose_cap(starts: Sequence[int], noisy_counts: Sequence[float], limit: int,
               terms: Sequence[CapTerm], groups: int = 1, epsilon: float = 0.0) -> int:
    """The cap minimising E(k) for a query without clipped columns; never above ``limit``.

    ``epsilon`` is the histogram's (0: treat the counts as exact).  100 units with 8 rows, one
    count (total): k = 8 loses nothing and costs the least noise.

    >>> choose_cap((1, 2, 4, 8), [0, 0, 0, 100], 8, [CapTerm(1.0, 1.0, True)])
    8
    """
    rows = RowModel(tuple(starts), tuple(float(c) for c in noisy_counts), limit, epsilon)
    return choose(rows, terms, (), groups).cap


#: The share of units allowed to lose some of their groups to the groups-per-unit bound g.
GROUP_QUANTILE = 0.01


@dataclass(frozen=True)
class GroupChoice:
    """The groups-per-unit bound g and whether it fell back to the limit (``noise_dominated``:
    the test rejected the smaller g the point estimates preferred; not to be stored for
    reuse, as ``Choice.noise_dominated``)."""

    groups: int
    noise_dominated: bool


def choose_groups(units: RowModel, gate_epsilon: float | None = None, delta: float = 0.0,
                  alpha: float = GROUP_QUANTILE) -> int:
    """The groups-per-unit bound g of ``choose_groups_checked`` (the bound alone)."""
    return choose_groups_checked(units, gate_epsilon, delta, alpha).groups


def choose_groups_checked(units: RowModel, gate_epsilon: float | None = None,
                          delta: float = 0.0, alpha: float = GROUP_QUANTILE) -> GroupChoice:
    """The groups-per-unit bound g for keys released by thresholding (``mechanisms.thresholding``).

    ``units`` is the noisy histogram of G_u, each unit's number of distinct groups in the
    query's filtered rows, over the bins of ``cap_bins`` (sensitivity 1: a unit is in one bin).
    ``gate_epsilon`` and ``delta`` are those of the key-release count (None: the quantile alone).

    Why a bound.  Without it a unit's k rows may reach k groups, so the key-release count has
    D = k and tau = 1 + (D / epsilon_t) ln(D / delta) grows with the cap: at k = 200 a query
    whose groups hold tens of thousands of units releases none of them.  Keeping each unit's
    rows in g of its groups gives D = min(g, k) and leaves the row cap k free to keep the rows
    within them (``rewriters.contribution.group_bound``).

    The quantile.  A unit with G_u <= g loses nothing, so g never needs to exceed g_q, the
    smallest candidate (bin start or end, as for the cap) that leaves all groups to all but a
    share alpha of the units:

        A(g) = sum_{b: m_b > g} H'_b <= alpha U,   U = sum_b H'_b,

    H' the consistent counts (``mechanisms.consistency``), m_b the bin's middle; if no
    candidate passes, g_q = the limit.  This is a DP quantile of the per-unit contributions
    (Amin et al., "Bounding user contributions: a bias-variance trade-off in differential
    privacy", ICML 2019); alpha = 1% keeps every group's distinct-unit count within about 1%.

    The suppression term.  At a small epsilon_t, tau(g_q) can exceed the groups' sizes: then a
    smaller g loses some (unit, group) pairs but releases more groups.  Among candidates
    g <= g_q, g minimises

        E(g) = L(g) / P + S(g),   S(g) = 1 - (1 + r) exp(-r),   r = tau(g) / n(g),

    where P = sum_b H'_b m_b is the (unit, group) pairs, L(g) = R(g) the pairs beyond g
    (``RowModel.lost`` over this histogram, z = 0), n(g) = (P - R(g)) / g_q the mean distinct
    units per group (g_q estimates the number of groups: for keys such as the hour of the day,
    units that reach many groups reach all of them; for finer keys it overestimates n, and g
    stays near g_q, where nothing could be released anyway), and S(g) the share of pairs in
    groups below tau when group sizes are exponential with mean n (the maximum-entropy law for
    a known mean): the integral of x exp(-x / n) / n^2 over [0, tau].  Both terms are shares of
    the distinct-unit counts lost.  Ties go to the larger g.

    Reading the noisy tail.  A(g) sums the counts of every bin above g, and most of the 27 bins
    of ``cap_bins(200)`` are empty for most keys.  The consistent counts keep a positive
    excursion of an empty bin's noise as phantom units (an empty bin's noise is positive half
    of the time, E[X+] = a / (1 - a^2) for discrete Laplace, a = exp(-epsilon_h): 0.96 units
    at epsilon_h = 0.5), and 20-odd empty bins hold as many phantom units as alpha U when U is
    about a thousand: with 1005 units in one group each and epsilon_h = 0.5 the quantile of
    the consistent counts took g > 2 in 32% of draws, 55% at epsilon_h = 0.1 (seeded
    simulation, ``benchmarks/groups_tail.py``).  Phantom units in high bins also weigh in L(g)
    by their middles, so the suppression term kept such g, tau(g) then hid every group.  So
    both terms read the soft-thresholded counts (``soft_threshold``, derived in
    ``mechanisms.quantile_cap`` for rows per unit): H''_b = max(0, H'_b - 2 sqrt(V)).  For
    Laplace noise of scale b (sd sqrt(2) b) an empty bin then keeps E[(X - 2 sqrt(2) b)+] =
    (b / 2) exp(-2 sqrt(2)) = 0.03 b units instead of b / 2, a 17th of the phantom mass, while
    a real bin of c units keeps c - 2 sqrt(V).  The quantile's A and U and the suppression
    term's P, L and n read H'' in place of H', within the floor below.

    The floor.  Shrinking every bin by 2 sd can erase a tail that holds many units in bins of
    a few each (each within 2 sd of empty): g would drop to where nothing says it should.  So
    g_q is never below the quantile's lower 95% limit on the consistent counts, g_lo, the
    smallest candidate with A(g) - Z sqrt(V |{b: m_b > g}|) <= alpha (U + Z sqrt(V n_bins)):
    below g_lo the histogram itself shows, at Z standard deviations of its noise, more than a
    share alpha of the units above g (the mirror of the test below).  g_q = max(g_q'', g_lo),
    g_q'' the quantile of the shrunk counts.  Likewise the suppression term reads the pairs at
    the larger of the two, P = max(P'', P' - Z sd P') and L(g) = min(P, max(L''(g), R'(g) -
    Z sd R'(g))) (``RowModel.all_rows_sd``, ``RowModel.lost`` at z = -Z: lower 95% limits on
    the consistent counts), n(g) = (P - L(g)) / g_q: a thin tail of units with many groups
    still counts as pairs lost.  It then searches g <= g_q as before (it may go below g_lo on
    purpose: pairs lost against groups released).  Measured (``benchmarks/groups_tail.py``):
    the shrinkage fixes the phantom tail, while a thin real tail (a few units in each of many
    bins, or 1.5% of units just above alpha) within 2 sd per bin is now read lower than before
    at epsilon_h <= 0.1, where the histogram cannot tell it from noise.

    Why point estimates here.  For the cap and the bounds the limit and the declared bounds are
    the safe fallback; for g the limit is the worst choice (tau(limit) releases nothing), and
    L(g) and S(g) are both losses of the same kind, so neither is taken at a confidence limit.
    The test only sets the flag: ``noise_dominated`` when the quantile at Z standard deviations
    (A(g) + Z sqrt(V |{b: m_b > g}|) <= alpha (U - Z sqrt(V n_bins)), on the consistent counts
    H', V the histogram noise's variance, ``discrete_laplace_variance``) finds no candidate
    below the limit while g_q is below it: the histogram does not clearly support g, so it is
    not stored for reuse.

    Privacy, and what g guarantees about the key release.  g is post-processing of the noisy
    histogram (shrinkage, floor and flag read only its released counts and the public
    epsilon_h, epsilon_t, delta and alpha): it costs nothing beyond the histogram's epsilon_h.
    The key-release threshold is planned at the chosen g, tau(D) with D = min(g, k), and
    ``rewriters.contribution.group_bound`` enforces D groups per unit in the query's rows, so
    (epsilon_t, delta) holds for every g the rule may return: no g is unsafe, a wrong one only
    costs accuracy (too large: tau(g) hides groups; too small: pairs are dropped).  Neither the
    shrinkage nor the floor is a guard for delta; the flag guards only reuse.

    1000 units with 17 to 19 groups each (the bin [17, 19], m = 18), exact counts: g_q = 19, the
    bin's end (g = 17, the start, leaves them all above it); at epsilon_t = 1 and delta 1e-8,
    tau(19) = 1 + 19 ln(19e8) = 406.9 against n = 1000 * 18 / 19 = 947.4 units per group:
    r = 0.430, E(19) = S = 0.070, while g = 17 drops a pair of every unit (L / P = 1 / 18 =
    0.056) for S(17) = 0.063 (tau 362.3, n = 17000 / 19): E(17) = 0.118, so g = 19.

    >>> one_bin = RowModel(cap_bins(200), (0,) * 11 + (1000,) + (0,) * 15, 200, 0.0)
    >>> choose_groups(one_bin), choose_groups(one_bin, 1.0, 1e-8)
    (19, 19)
    """
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    if gate_epsilon is not None and (not gate_epsilon > 0 or not 0 < delta < 1):
        raise ValueError("the key-release count needs epsilon > 0 and 0 < delta < 1")
    # The key-release threshold makes the limit the worst g, not a safe default (it releases
    # nothing), so g itself comes from point estimates: of the soft-thresholded counts (the
    # consistent ones keep phantom units in the empty tail), never below the quantile's lower
    # 95% limit.  The test (the quantile at Z) only says whether the histogram clearly
    # supports a quantile below the limit.
    shrunk = soft_threshold(units)
    quantile = max(_quantile(shrunk, alpha, 0.0), _quantile(units, alpha, -Z))
    chosen = _groups(units, quantile, gate_epsilon, delta)
    supported = _quantile(units, alpha, Z) < units.limit
    return GroupChoice(chosen, not supported and quantile < units.limit)


def _quantile(units: RowModel, alpha: float, z: float) -> int:
    """g_q: the smallest candidate with A(g) <= alpha U, the units above g at their estimate
    plus z standard deviations and all units at theirs minus z (the limit if none)."""
    h = np.asarray(units.counts())
    middles = units._middles
    variance = units.variance
    total = max(float(h.sum()) - z * math.sqrt(variance * len(h)), 1.0)
    for g in units.candidates():
        above = middles > g
        found = float(h[above].sum()) + z * math.sqrt(variance * int(above.sum()))
        if found <= alpha * total:
            return g
    return units.limit


def _groups(units: RowModel, quantile: int, gate_epsilon: float | None, delta: float) -> int:
    """g (``choose_groups_checked``): the candidate g <= ``quantile`` (g_q) of least E(g), the
    pairs read as the larger of the soft-thresholded counts' estimate and the consistent
    counts' lower 95% limit (the floor)."""
    if gate_epsilon is None:
        return quantile
    shrunk = soft_threshold(units)
    pairs = max(shrunk.all_rows(), units.all_rows() - Z * units.all_rows_sd())
    best, best_error = quantile, math.inf
    for g in reversed([c for c in units.candidates() if c <= quantile]):
        lost = min(max(shrunk.lost(g, 0.0), units.lost(g, -Z)), pairs)
        per_group = max(pairs - lost, 1.0) / quantile
        r = key_release_threshold(g / gate_epsilon, g, delta) / per_group
        error = lost / pairs + 1.0 - (1.0 + r) * math.exp(-r)
        if error < best_error:
            best, best_error = g, error
    return best
