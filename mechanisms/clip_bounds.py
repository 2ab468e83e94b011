"""Choosing a summed column's clipping bounds per query from a noisy histogram (clipping = "auto").

A SUM, AVG, VARIANCE or STDDEV clips every row's value x into the declared [l, u]; the noise of
the measurement is proportional to the per-row bound (max(|l|, |u|) for a sum, (u - l) / 2 for
a sum centred on the middle of the interval, its square for a sum of squares).  Declared bounds
must hold for every query and are wide; most queries' values are far inside them.  Clipping to a
narrower [l', u'] inside [l, u] removes noise and adds bias (the part of every value beyond the
new bound is lost).  This module estimates both from a noisy histogram and picks the bound.

Why clip each row (and not each unit's total).  Clipping each unit's sum instead would need a
different measurement for every aggregate (AVG and VARIANCE divide by per-row counts); per-row
clipping keeps every measurement, its SQL and its sensitivity formula (``analyses.sensitivity``)
as they are, only with [l', u'] in place of [l, u], and combines with the row cap k chosen by
``mechanisms.caps``: the pair (k, [l', u']) is chosen jointly there.

The histogram.  Let M = max(|l|, |u|).  Magnitudes |clip(x, l, u)| fall into bins: bin 0 holds
exactly M (values that reach the declared bound, often many), bin j = 1..J holds
[M 2^(-j/2), M 2^(-(j-1)/2)) (each bin about 41% wide, J = 24 reaches M / 4096), and bin J + 1
holds [0, M 2^(-J/2)).  Rows with a NULL value are left out (SUM ignores them).  Each row of a
privacy unit with c_u non-NULL rows in the query's filtered relation adds weight 1 / c_u to its
bin, so every unit adds weight exactly 1 in total, spread over the bins (event-level tables: one
row is one unit, weight 1).  Adding or removing one unit changes the histogram by a vector of
L1 norm 1: sensitivity 1, whatever the number of rows per unit.  (Counting rows instead would
have sensitivity = the rows a unit may have.)  The weights are fractions, so the noise is the
snapping mechanism of sensitivity 1 and epsilon_h: epsilon_h-DP.  The histogram describes the
values of the average unit; the rule uses it as the distribution of the rows the query keeps
(each unit keeps min(c_u, k) rows drawn at random among its own, so that holds when heavy and
light units have similar values; if not, only accuracy suffers, never privacy).

The bound.  From the consistent weights H'_j (``mechanisms.consistency``: non-negative, with
monotone weight above every edge; the tail is bin 0, the largest magnitudes) with
representative magnitudes a_0 = M, a_j = the middle of bin j, let W = sum_j H'_j, p_j = H'_j / W
and, for a candidate magnitude bound B,

    mu      = sum_j p_j a_j                       (mean magnitude at the declared bounds)
    mu(B)   = sum_j p_j min(a_j, B)               (mean magnitude clipped at B)
    loss(B) = (mu - mu(B)) / mu                   (relative clipping bias of a sum or a mean)
    nu(B)   = sum_j p_j min(a_j, B)^2 - mu(B)^2   (spread, the scale of a centred sum of squares)

The clipping interval at B is [l', u'] = [max(l, -B), min(u, B)] (B ranges over the bin edges
M 2^(-j/2), j = 0..J; an empty interval is not a candidate).  The per-row sensitivity of each
measurement at B follows from [l', u'] exactly as in ``analyses.query._derive``.

Their noise (the delta method: each is a ratio of two sums linear in H'_j, whose bins have
independent noise of variance V, the snapping mechanism's variance bound; A = W mu):

    sd loss(B) = sqrt(V sum_j (max(0, a_j - B) - loss(B) a_j)^2) / A
    sd mu      = sqrt(V sum_j (a_j - mu)^2) / W

The rule (``mechanisms.caps``, "The test") takes loss(B) and mu at their upper 95% estimates
(Z = 1.645 standard deviations): the bound narrows only where the histogram shows clearly
that little mass lies beyond it, and an underestimated mu cannot make the declared bound's
noise look larger than it is.  A column whose histogram shows no values at all, A - Z sqrt(V
sum_j a_j^2) <= 0 (``ClipColumn.measured``), keeps its declared bound.  The bound is a
function of the noisy histogram only (post-processing).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from mechanisms.consistency import consistent_counts
from mechanisms.snapping import Snapping

#: The test's one-sided normal quantile: every estimate that argues for a narrower bound or a
#: smaller cap is taken at its 95% confidence limit (``mechanisms.caps``, "The test").
Z = 1.645

#: Number of geometric bins below the declared magnitude bound (edges M 2^(-j/2), j <= J).
STEPS = 24

SumKind = Literal["sum", "sum_squares"]


# The rule evaluates every (cap, bound) pair: the pure helpers below are cached, so choosing
# costs microseconds per candidate instead of rebuilding the same tuples thousands of times.
@functools.lru_cache(maxsize=256)
def magnitude_edges(magnitude: float) -> tuple[float, ...]:
    """The bin edges M 2^(-j/2), j = 0..STEPS, largest first (also the candidate bounds).

    >>> [round(e, 3) for e in magnitude_edges(200.0)[:4]]
    [200.0, 141.421, 100.0, 70.711]
    """
    if not magnitude > 0 or not math.isfinite(magnitude):
        raise ValueError("the declared bound must be positive and finite")
    return tuple(magnitude * 2.0 ** (-j / 2) for j in range(STEPS + 1))


@functools.lru_cache(maxsize=256)
def representatives(magnitude: float) -> tuple[float, ...]:
    """a_j for bins 0..STEPS + 1: M, then the middle of each bin (see the module docstring)."""
    edges = magnitude_edges(magnitude)
    middles = [(edges[j] + edges[j - 1]) / 2 for j in range(1, STEPS + 1)]
    return (magnitude, *middles, edges[-1] / 2)


@dataclass(frozen=True)
class ClipColumn:
    """A summed expression whose bound is chosen: its declared [l, u] and noisy histogram."""

    lower: float
    upper: float
    noisy: tuple[float, ...]   # H_0 .. H_{STEPS + 1}, from the snapping mechanism
    epsilon: float = 0.0       # the histogram's epsilon_h (0: exact counts, no uncertainty)

    def __post_init__(self) -> None:
        if not self.lower <= self.upper:
            raise ValueError("lower must be <= upper")
        if len(self.noisy) != STEPS + 2:
            raise ValueError(f"expected {STEPS + 2} histogram bins")

    @functools.cached_property
    def magnitude(self) -> float:
        """M = max(|l|, |u|)."""
        return max(abs(self.lower), abs(self.upper))

    def candidates(self) -> list[float]:
        """Magnitude bounds B with a non-empty interval [max(l, -B), min(u, B)], largest first."""
        return [b for b in magnitude_edges(self.magnitude)
                if max(self.lower, -b) <= min(self.upper, b)]

    def interval(self, bound: float) -> tuple[float, float]:
        """[l', u'] = [max(l, -B), min(u, B)]; the declared interval itself at B = M."""
        if bound >= self.magnitude:
            return (self.lower, self.upper)
        return (max(self.lower, -bound), min(self.upper, bound))

    def _weights(self) -> tuple[np.ndarray, np.ndarray]:
        return self._normalised

    @functools.cached_property
    def _memo(self) -> dict[tuple[str, float | None], float]:
        return {}

    @functools.cached_property
    def _histogram_variance(self) -> float:
        """The variance of one bin's noise (the snapping mechanism at epsilon_h; 0: exact)."""
        if not self.epsilon > 0:
            return 0.0
        return Snapping.from_sensitivity(1.0, self.epsilon).variance()

    @functools.cached_property
    def _consistent(self) -> np.ndarray:
        """H': the noisy weights made consistent (``mechanisms.consistency``), the tail being
        the large magnitudes (bin 0 = M first): non-negative, monotone weight above each edge."""
        return consistent_counts(np.asarray(self.noisy, dtype=float)[::-1])[::-1]

    def weights(self) -> tuple[float, ...]:
        """H'_j, the consistent weights every estimate reads."""
        return tuple(float(w) for w in self._consistent)

    @functools.cached_property
    def _normalised(self) -> tuple[np.ndarray, np.ndarray]:
        h = self._consistent.copy()
        total = float(h.sum())
        a = np.asarray(representatives(self.magnitude))
        if total < 1.0:
            # Nothing measurable: assume every value sits at the declared bound (the rule then
            # sees no bias in clipping there and keeps [l, u] unless noise alone argues).
            h = np.zeros_like(h)
            h[0], total = 1.0, 1.0
        return h / total, a

    @functools.cached_property
    def _total(self) -> tuple[float, float]:
        """(W, A) = (sum_j H'_j, sum_j H'_j a_j), each at least a tiny positive floor."""
        a = np.asarray(representatives(self.magnitude))
        return (max(float(self._consistent.sum()), 1.0),
                max(float(self._consistent @ a), self.magnitude * 1e-9))

    def measured(self, z: float = Z) -> bool:
        """Whether the histogram shows values at all: A - z sd A > 0, A = sum_j H'_j a_j the
        weighted magnitude (the column's sum per unit), sd A = sqrt(V sum_j a_j^2)."""
        a = np.asarray(representatives(self.magnitude))
        found = float(self._consistent @ a)
        return found - z * math.sqrt(self._histogram_variance * float(a @ a)) > 0

    # Each statistic at every candidate bound at once (``mechanisms.caps`` tabulates them per
    # column: one array operation instead of a few per bound, 5 ms -> 0.3 ms per choice); the
    # one-bound methods below read them.  Rows are bounds, columns the histogram's bins.
    def _clipped(self, bounds: np.ndarray) -> np.ndarray:
        return np.minimum(np.asarray(representatives(self.magnitude))[None, :],
                          np.asarray(bounds, dtype=float)[:, None])

    def means(self, bounds: np.ndarray) -> np.ndarray:
        """mu(B) at every bound, never below a tiny positive floor."""
        p, _ = self._weights()
        return np.maximum(np.sum(p * self._clipped(bounds), axis=1), self.magnitude * 1e-9)

    def mean_sds(self, bounds: np.ndarray) -> np.ndarray:
        """sd mu(B) = sqrt(V sum_j (min(a_j, B) - mu(B))^2) / W (the delta method on a ratio of
        two sums of H'_j; 0 for exact weights)."""
        if not self.epsilon > 0:
            return np.zeros(len(bounds))
        deviation = self._clipped(bounds) - self.means(bounds)[:, None]
        return np.sqrt(self._histogram_variance * np.sum(deviation * deviation, axis=1)) \
            / self._total[0]

    def losses(self, bounds: np.ndarray) -> np.ndarray:
        """loss(B) = (mu - mu(B)) / mu, in [0, 1]."""
        full = self.mean()
        return np.clip((full - self.means(bounds)) / full, 0.0, 1.0)

    def loss_sds(self, bounds: np.ndarray) -> np.ndarray:
        """sd loss(B) = sqrt(V sum_j (e_j - loss(B) a_j)^2) / A, e_j = max(0, a_j - B): the
        delta method on loss(B) = sum_j H'_j e_j / sum_j H'_j a_j (0 for exact weights)."""
        if not self.epsilon > 0:
            return np.zeros(len(bounds))
        a = np.asarray(representatives(self.magnitude))[None, :]
        column = np.asarray(bounds, dtype=float)[:, None]
        deviation = np.maximum(a - column, 0.0) - self.losses(bounds)[:, None] * a
        return np.sqrt(self._histogram_variance * np.sum(deviation * deviation, axis=1)) \
            / self._total[1]

    def spreads(self, bounds: np.ndarray) -> np.ndarray:
        """nu(B), floored at a tiny positive value."""
        p, _ = self._weights()
        clipped = self._clipped(bounds)
        mu = np.sum(p * clipped, axis=1)
        return np.maximum(np.sum(p * clipped * clipped, axis=1) - mu * mu,
                          (self.magnitude * 1e-6) ** 2)

    def spread_losses(self, bounds: np.ndarray) -> np.ndarray:
        """(nu(M) - nu(B)) / nu(M) in [0, 1]: the share of the spread clipping at B removes.

        A VARIANCE (or STDDEV) of values clipped at B estimates nu(B), not nu(M): clipping the
        tail shrinks the spread far more than the mean (a value beyond B loses its distance to
        the mean squared), so the rule charges this bias to the sum of squares, at its upper
        estimate spread_loss + Z spread_loss_sd.
        """
        full = self.spread(self.magnitude)
        return np.clip((full - self.spreads(bounds)) / full, 0.0, 1.0)

    def spread_loss_sds(self, bounds: np.ndarray) -> np.ndarray:
        """An upper bound on sd spread_loss(B): sqrt(V sum_j max(0, a_j^2 - B^2)^2) / (W nu(M)).

        nu(M) - nu(B) = sum_j p_j (a_j^2 - min(a_j, B)^2) - (mu^2 - mu(B)^2); dropping the mu
        terms, which only subtract (a_j^2 - B^2 >= 2 mu (a_j - B) when a_j + B >= 2 mu), leaves
        a sum of H'_j / W.  Values near the declared bound weigh a_j^2: a few noisy units there
        are worth much spread, so a tail is cut only when the histogram clearly shows it empty.
        """
        if not self.epsilon > 0:
            return np.zeros(len(bounds))
        a = np.asarray(representatives(self.magnitude))[None, :]
        column = np.asarray(bounds, dtype=float)[:, None]
        beyond = np.maximum(a * a - column * column, 0.0)
        return np.sqrt(self._histogram_variance * np.sum(beyond * beyond, axis=1)) / (
            self._total[0] * self.spread(self.magnitude))

    def kurtoses(self, bounds: np.ndarray) -> np.ndarray:
        """kappa(B) = E[(x - mu(B))^4] / nu(B)^2 of the clipped magnitudes, at least 1.

        The relative variance of a variance estimated from n rows is about (kappa - 1) / n
        (for a normal distribution, kappa = 3: 2 / n).
        """
        p, _ = self._weights()
        clipped = self._clipped(bounds)
        mu = np.sum(p * clipped, axis=1)
        fourth = np.sum(p * (clipped - mu[:, None]) ** 4, axis=1)
        return np.maximum(fourth / self.spreads(bounds) ** 2, 1.0)

    def _one(self, many: Callable[[np.ndarray], np.ndarray], bound: float | None) -> float:
        """The statistic ``many`` at one bound (None: the declared magnitude), remembered per
        bound: the rule asks for some of them once per candidate cap."""
        at = self.magnitude if bound is None else bound
        key = (many.__name__, at)
        if key not in self._memo:
            self._memo[key] = float(many(np.array([at]))[0])
        return self._memo[key]

    def mean(self, bound: float | None = None) -> float:
        """mu(B) (``means``; mu at B = None: at the declared magnitude)."""
        return self._one(self.means, bound)

    def mean_sd(self, bound: float | None = None) -> float:
        """sd mu(B) (``mean_sds``; at B = None, at the declared magnitude)."""
        return self._one(self.mean_sds, bound)

    def loss(self, bound: float) -> float:
        """loss(B) (``losses``)."""
        return self._one(self.losses, bound)

    def loss_sd(self, bound: float) -> float:
        """sd loss(B) (``loss_sds``)."""
        return self._one(self.loss_sds, bound)

    def loss_upper(self, bound: float, z: float = Z) -> float:
        """loss(B) + z sd loss(B): the clipping bias at its upper estimate (module docstring).

        Not capped at 1: an upper estimate beyond 100% says the histogram cannot tell, and
        capping it would let every narrow bound tie (the failure this rule replaces)."""
        return self.loss(bound) + z * self.loss_sd(bound)

    def spread(self, bound: float) -> float:
        """nu(B) (``spreads``)."""
        return self._one(self.spreads, bound)

    def spread_loss(self, bound: float) -> float:
        """(nu(M) - nu(B)) / nu(M) (``spread_losses``)."""
        return self._one(self.spread_losses, bound)

    def kurtosis(self, bound: float) -> float:
        """kappa(B) (``kurtoses``)."""
        return self._one(self.kurtoses, bound)

    def per_row(self, bound: float, kind: SumKind, centred: bool) -> float:
        """The per-row bound d of a measurement over [l', u'] (its sensitivity is k d)."""
        key = (f"per_row {kind} {centred}", bound)
        if key not in self._memo:
            self._memo[key] = self._per_row(bound, kind, centred)
        return self._memo[key]

    def offsets(self, bounds: np.ndarray, centred: bool) -> np.ndarray:
        """s(B) = |E[clip(x)] - c| at every bound, the mean's distance from the centre c of a
        ratio's sums.

        An AVG is c + S / N and a VARIANCE (Q - S^2 / N) / (N - 1), S and Q summing x - c (c =
        (l' + u') / 2 when ``centred``, else 0), so the count's noise reaches the answer times s
        (``mechanisms.caps``).  The histogram holds magnitudes: for l >= 0 they are the values
        and s = |mu(B) - c|; for u <= 0 the values are -|x| and s = |mu(B) + c|; for an interval
        around 0 the sign is lost and s is taken at its upper bound min(h, mu(B) + |c|), h =
        max(|l' - c|, |u' - c|) (a mean lies in [l', u'], and |E x - c| <= E|x| + |c|).
        """
        bounds = np.asarray(bounds, dtype=float)
        declared = bounds >= self.magnitude  # ``interval``: the declared one at B >= M
        lo = np.where(declared, self.lower, np.maximum(self.lower, -bounds))
        hi = np.where(declared, self.upper, np.minimum(self.upper, bounds))
        c = (lo + hi) / 2 if centred else np.zeros(len(bounds))
        mean = self.means(bounds)
        if self.lower >= 0:
            return np.abs(mean - c)
        if self.upper <= 0:
            return np.abs(mean + c)
        return np.minimum(np.maximum(np.abs(lo - c), np.abs(hi - c)), mean + np.abs(c))

    def offset(self, bound: float, centred: bool) -> float:
        """s(B) at one bound (``offsets``)."""
        key = (f"offset {centred}", bound)
        if key not in self._memo:
            self._memo[key] = float(self.offsets(np.array([bound]), centred)[0])
        return self._memo[key]

    def _per_row(self, bound: float, kind: SumKind, centred: bool) -> float:
        lo, hi = self.interval(bound)
        if centred:
            half = (hi - lo) / 2
            return half * half if kind == "sum_squares" else half
        big = max(abs(lo), abs(hi))
        return big * big if kind == "sum_squares" else big
