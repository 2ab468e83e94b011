"""The sensitivity sampler's parameters: how many databases to draw (m), which order statistic
of their sensitivities to use (k), and the free parameter rho.

B. Rubinstein and F. Aldà, "Pain-Free Random Differential Privacy with Sensitivity Sampling",
ICML 2017, Theorem 15: draw m i.i.d. pairs of neighbouring databases (D, D') of n rows from a
non-sensitive distribution P (D' is D with one row replaced), let G_1 <= ... <= G_m be the sorted
values ||f(D) - f(D')||_1, and run any sensitivity-calibrated mechanism with the sensitivity
G_(k).  For rho in (0, min(gamma, 1/2)), if

    m >= ln(1 / rho) / (2 (gamma - rho)^2)                                       (1)
    k  = ceil(m (1 - gamma + rho + sqrt(ln(1 / rho) / (2 m))))                    (2)

then the composition is (epsilon, delta, gamma)-random DP: with probability at least 1 - gamma
over the database drawn from P (and the sampler's own draws) the release is (epsilon, delta)-DP.
(1) is exactly the condition k <= m: sqrt(ln(1/rho) / (2m)) <= gamma - rho.

rho is free.  Two ways to choose it (Corollaries 20 and 21):

* the smallest m for a given gamma: minimise g(rho) = ln(1/rho) / (gamma - rho)^2.  g'(rho) = 0
  is h(rho) = gamma / rho - 1 - 2 ln(1 / rho) = 0; h decreases on (0, gamma/2) from +inf
  (h' = (2 rho - gamma) / rho^2) and h(gamma) = -2 ln(1/gamma) < 0, so the root is unique and
  lies in (0, gamma/2): bisection.  At that m, k = m (the largest sampled sensitivity);
* the smallest k for a given m: minimise q(rho) = rho + sqrt(ln(1/rho) / (2m)), convex on
  (0, 1/2) with q'(rho) = 1 - 1 / (2 rho sqrt(2 m ln(1/rho))); rho sqrt(ln(1/rho)) increases on
  (0, e^-1/2), so q' has one root there: bisection.  The rho is feasible when q(rho) <= gamma.

This module knows nothing about SQL: the engine (``chorus_py.kinds.sampled``) draws the databases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_BISECTIONS = 200  # far more than the ~60 halvings a double can resolve


def _check_gamma(gamma: float) -> float:
    g = float(gamma)
    if not math.isfinite(g) or not 0.0 < g < 1.0:
        raise ValueError(f"gamma must be in (0, 1), got {gamma!r}")
    return g


def _check_rho(gamma: float, rho: float) -> float:
    r = float(rho)
    if not math.isfinite(r) or not 0.0 < r < min(gamma, 0.5):
        raise ValueError(f"rho must be in (0, min(gamma, 1/2)) = (0, {min(gamma, 0.5):g}), "
                         f"got {rho!r}")
    return r


def min_samples(gamma: float, rho: float) -> int:
    """The smallest m of (1): ceil(ln(1/rho) / (2 (gamma - rho)^2))."""
    g = _check_gamma(gamma)
    r = _check_rho(g, rho)
    return math.ceil(math.log(1.0 / r) / (2.0 * (g - r) ** 2))


def order_index(m: int, gamma: float, rho: float) -> int:
    """k of (2): ceil(m (1 - gamma + rho + sqrt(ln(1/rho) / (2m)))); ValueError when k > m."""
    g = _check_gamma(gamma)
    r = _check_rho(g, rho)
    if m < 1:
        raise ValueError(f"m must be a positive integer, got {m!r}")
    k = math.ceil(m * (1.0 - g + r + math.sqrt(math.log(1.0 / r) / (2.0 * m))))
    if k > m:
        raise ValueError(f"m = {m} is too small for gamma = {g:g} at rho = {r:g}: it needs "
                         f"m >= {min_samples(g, r)}")
    return max(k, 1)


def _bisect(f: object, lo: float, hi: float) -> float:
    """The root of a function positive at ``lo`` and negative at ``hi`` (sign change once)."""
    assert callable(f)
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2.0
        if mid in (lo, hi):
            break
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def rho_for_min_samples(gamma: float) -> float:
    """The rho that minimises m for ``gamma`` (the root of h, see the module doc)."""
    g = _check_gamma(gamma)

    def h(r: float) -> float:
        return g / r - 1.0 - 2.0 * math.log(1.0 / r)

    return _bisect(h, 1e-300, g / 2.0)


def rho_for_min_order(gamma: float, m: int) -> float:
    """The feasible rho that minimises k for ``m`` samples (ValueError: m too small)."""
    g = _check_gamma(gamma)
    if m < 1:
        raise ValueError(f"m must be a positive integer, got {m!r}")
    upper = min(g, 0.5)

    def minus_dq(r: float) -> float:  # -q'(r): positive left of the minimum
        return 1.0 / (2.0 * r * math.sqrt(2.0 * m * math.log(1.0 / r))) - 1.0

    root = _bisect(minus_dq, 1e-300, math.exp(-0.5))
    rho = min(root, math.nextafter(upper, 0.0))
    if rho + math.sqrt(math.log(1.0 / rho) / (2.0 * m)) > g:
        need = min_samples(g, rho_for_min_samples(g))
        raise ValueError(f"m = {m} samples cannot give gamma = {g:g}: it needs m >= {need}")
    return rho


@dataclass(frozen=True)
class SamplerParameters:
    """gamma, the number of sampled databases m, the order statistic k (1-based) and rho."""

    gamma: float
    m: int
    k: int
    rho: float

    def describe(self) -> dict[str, float | int]:
        """For reports."""
        return {"gamma": self.gamma, "m": self.m, "k": self.k, "rho": self.rho}


def sampler_parameters(gamma: float, m: int | None = None) -> SamplerParameters:
    """Theorem 15's parameters: the fewest samples for ``gamma`` when ``m`` is None, else the
    smallest order statistic k for ``m`` samples (ValueError when m is below the minimum)."""
    g = _check_gamma(gamma)
    if m is None:
        rho = rho_for_min_samples(g)
        m = min_samples(g, rho)
    else:
        rho = rho_for_min_order(g, m)
    return SamplerParameters(g, m, order_index(m, g, rho), rho)


def order_statistic(values: np.ndarray, k: int) -> float:
    """The k-th smallest of ``values`` (1-based, as in the paper)."""
    arr = np.asarray(values, dtype=float).ravel()
    if not 1 <= k <= arr.size:
        raise ValueError(f"k = {k} is outside [1, {arr.size}]")
    return float(np.partition(arr, k - 1)[k - 1])
