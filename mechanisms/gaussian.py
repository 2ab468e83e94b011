"""The Gaussian mechanism, calibrated exactly (analytic Gaussian) or by the classic bound."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import ClassVar, Literal

import numpy as np
from sqlglot import exp

from mechanisms.base import (
    UNIFORM_SQL,
    Mechanism,
    check_confidence,
    check_dialect,
    check_epsilon,
    check_sensitivity,
    check_values,
    fill_template,
    float_literal,
)
from mechanisms.randomness import secure_uniform, secure_uniform_dense
from mechanisms.rdp import gaussian_rdp

__all__ = ["Gaussian", "gaussian_delta"]

# Box-Muller: sqrt(-2 ln U1) cos(2 pi U2) is a standard normal for independent uniforms U1, U2.
_SQL = f":v + :sigma * SQRT(-2 * LN({UNIFORM_SQL})) * COS(2 * PI() * RANDOM())"

_SQRT2 = math.sqrt(2.0)


def _log_phi(x: float) -> float:
    """ln Phi(x) for the standard normal CDF; erfc keeps the lower tail accurate."""
    value = 0.5 * math.erfc(-x / _SQRT2)
    return math.log(value) if value > 0.0 else -math.inf


def gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """The smallest delta for which N(0, sigma**2) noise is (epsilon, delta)-DP at this sensitivity.

    B. Balle and Y.-X. Wang, "Improving the Gaussian Mechanism for Differential Privacy: Analytical
    Calibration and Optimal Denoising", ICML 2018, arXiv:1805.06530, Theorem 8:

        delta = Phi(D/(2 sigma) - epsilon sigma/D) - e**epsilon Phi(-D/(2 sigma) - epsilon sigma/D)

    (necessary and sufficient). The second term is computed as exp(epsilon + ln Phi(.)) so that a
    large epsilon does not overflow.
    """
    a = sensitivity / (2.0 * sigma)
    c = epsilon * sigma / sensitivity
    first = 0.5 * math.erfc(-(a - c) / _SQRT2)
    log_second = epsilon + _log_phi(-a - c)
    second = math.exp(min(log_second, 700.0)) if log_second > -math.inf else 0.0
    return max(0.0, first - second)


def _analytic_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """The smallest sigma (to ~1e-13 relative) with gaussian_delta(sigma) <= delta.

    gaussian_delta decreases in sigma, so bisect on ln(sigma); the upper end of the bracket always
    satisfies the condition, and it is what is returned (rounding towards more noise).
    """

    def fits(s: float) -> bool:
        return gaussian_delta(s, sensitivity, epsilon) <= delta

    hi = sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon  # classic, a good start
    lo = hi
    while not fits(hi):
        hi *= 2.0
    while fits(lo):
        lo /= 2.0
        if lo < 1e-300:  # unreachable for delta < 1: delta(sigma) -> 1 as sigma -> 0
            raise ValueError(f"delta {delta!r} is too large to calibrate a Gaussian mechanism")
    while hi / lo - 1.0 > 1e-13:
        mid = math.sqrt(lo * hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True, kw_only=True)
class Gaussian(Mechanism):
    """The Gaussian mechanism: value + X with X ~ N(0, sigma**2).

    Density: p(x) = exp(-x**2 / (2 sigma**2)) / (sigma sqrt(2 pi)). Variance sigma**2; the
    two-sided error bound at confidence c is sigma Phi^-1((1 + c) / 2).

    ``sensitivity`` is the L2 sensitivity D.

    Calibration (``from_sensitivity``): the analytic Gaussian mechanism, the smallest sigma with
    Phi(D/(2 sigma) - epsilon sigma/D) - e**epsilon Phi(-D/(2 sigma) - epsilon sigma/D) <= delta (B.
    Balle and Y.-X. Wang, ICML 2018, arXiv:1805.06530, Theorem 8 and Algorithm 1), found by
    bisection. It is exact, valid for every epsilon > 0, and smaller than the classic bound.
    ``classic`` gives sigma = D sqrt(2 ln(1.25 / delta)) / epsilon, valid only for epsilon < 1 (C.
    Dwork and A. Roth, "The Algorithmic Foundations of Differential Privacy", 2014, Theorem A.1).

    Rényi curve: alpha D**2 / (2 sigma**2) (I. Mironov, "Rényi Differential Privacy", CSF 2017,
    arXiv:1702.07476v3, Proposition 7).

    SQL: Box-Muller, ``value + sigma * SQRT(-2 LN(U1)) * COS(2 PI() U2)``. Like plain Laplace, a
    floating-point Gaussian sample is exposed to Mironov's low-order-bit attack (CCS 2012); prefer
    the pure-DP mechanisms for released SQL values unless Gaussian composition is needed.
    """

    name: ClassVar[str] = "gaussian"

    calibration: Literal["analytic", "classic"] = "analytic"

    @classmethod
    def from_sensitivity(cls, sensitivity: float, epsilon: float, delta: float) -> Gaussian:
        """The analytic Gaussian calibration (Balle and Wang 2018) for L2 ``sensitivity``."""
        d = check_sensitivity(sensitivity)
        eps = check_epsilon(epsilon)
        dl = _check_delta(delta)
        sigma = _analytic_sigma(d, eps, dl)
        return cls(sensitivity=d, epsilon=eps, delta=dl, scale=sigma, calibration="analytic")

    @classmethod
    def classic(cls, sensitivity: float, epsilon: float, delta: float) -> Gaussian:
        """sigma = D sqrt(2 ln(1.25/delta)) / epsilon (Dwork & Roth 2014, Thm A.1); epsilon < 1."""
        d = check_sensitivity(sensitivity)
        eps = check_epsilon(epsilon)
        dl = _check_delta(delta)
        if eps >= 1.0:
            raise ValueError(
                f"the classic Gaussian calibration needs epsilon < 1, got {epsilon!r}; "
                f"use Gaussian.from_sensitivity (analytic calibration) instead"
            )
        sigma = d * math.sqrt(2.0 * math.log(1.25 / dl)) / eps
        return cls(sensitivity=d, epsilon=eps, delta=dl, scale=sigma, calibration="classic")

    def _check_calibration(self) -> None:
        _check_delta(self.delta)
        if self.calibration not in ("analytic", "classic"):
            raise ValueError(f"unknown Gaussian calibration {self.calibration!r}")
        # Theorem 8 is an exact characterisation, so it checks either calibration.
        actual = gaussian_delta(self.scale, self.sensitivity, self.epsilon)
        if actual > self.delta:
            raise ValueError(
                f"sigma {self.scale!r} only gives delta {actual!r} > {self.delta!r} at epsilon "
                f"{self.epsilon!r}"
            )

    def error_bound(self, confidence: float = 0.95) -> float:
        """sigma Phi^-1((1 + c)/2), computed as -sigma Phi^-1((1 - c)/2) to stay accurate near 1."""
        c = check_confidence(confidence)
        return -self.scale * NormalDist().inv_cdf((1.0 - c) / 2.0)

    def variance(self) -> float:
        """sigma**2."""
        return self.scale * self.scale

    def render_sql(self, value: exp.Expr, dialect: str) -> exp.Expr:
        """``value + sigma * SQRT(-2 * LN(U1)) * COS(2 * PI() * U2)`` (Box-Muller)."""
        check_dialect(dialect)
        return fill_template(_SQL, v=value, sigma=float_literal(self.scale))

    def sample(self, values: np.ndarray) -> np.ndarray:
        """values + N(0, sigma**2) by Box-Muller on os.urandom uniforms."""
        arr = check_values(values)
        n = arr.size
        radius = np.sqrt(-2.0 * np.log(secure_uniform_dense(n)))
        noise = self.scale * radius * np.cos(2.0 * np.pi * secure_uniform(n))
        return arr + noise.reshape(arr.shape)

    def rdp(self, alpha: float) -> float:
        """alpha D**2 / (2 sigma**2) (Mironov 2017, Proposition 7)."""
        return gaussian_rdp(alpha, self.scale / self.sensitivity)


def _check_delta(delta: float) -> float:
    try:
        dl = float(delta)
    except (TypeError, ValueError):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}") from None
    if not 0.0 < dl < 1.0:
        raise ValueError(f"delta must be in (0, 1) for the Gaussian mechanism, got {delta!r}")
    return dl
