"""Rényi-DP curves of the additive noise mechanisms.

A mechanism M is (alpha, rho)-Rényi-DP (Mironov, "Rényi Differential Privacy", CSF 2017,
arXiv:1702.07476v3) when the Rényi divergence of order alpha between M(x) and M(x') is at most rho
for all neighbours x, x':

    D_alpha(P || Q) = 1 / (alpha - 1) * ln E_{Y ~ Q}[(P(Y) / Q(Y))**alpha].

Every function here returns rho for one order alpha in [1, inf]; alpha = 1 is the limit (the
Kullback-Leibler divergence) and alpha = inf the max divergence (pure DP epsilon). The numerics are
written so that large 1/b, large alpha and alpha close to 1 neither overflow nor cancel badly
(``log1p``/``expm1``/``logaddexp``). Out-of-domain arguments raise ``ValueError``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["discrete_laplace_rdp", "gaussian_rdp", "laplace_rdp", "pure_dp_rdp"]

# Relative rounding error of a double; used to round the discrete Laplace curve up
# (pessimistically).
_ULP = 2.0**-52
# Orders closer to 1 than this use the discrete Laplace curve at 1 + _NEAR_ONE (see there).
_NEAR_ONE = 1e-4


def _check_alpha(alpha: float) -> float:
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"the Rényi order alpha must be a number >= 1, got {alpha!r}") from None
    if math.isnan(a) or a < 1.0:
        raise ValueError(f"the Rényi order alpha must be >= 1 (or inf), got {alpha!r}")
    return a


def _check_positive_finite(value: float, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a positive finite number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"{what} must be a positive finite number, got {value!r}")
    return v


def laplace_rdp(alpha: float, b: float) -> float:
    """Rényi-DP of the Laplace mechanism with sensitivity 1 and scale ``b``, at order ``alpha``.

    Mironov 2017 (arXiv:1702.07476v3), Proposition 6, for alpha > 1:

        1/(alpha-1) * ln( alpha/(2 alpha - 1) * exp((alpha-1)/b)
                          + (alpha-1)/(2 alpha - 1) * exp(-alpha/b) )

    alpha = 1 gives the KL divergence 1/b + exp(-1/b) - 1 and alpha = inf gives 1/b (the pure
    epsilon). For a query of sensitivity D and noise scale b use ``laplace_rdp(alpha, b / D)``.

    Two numerical forms: with x = (alpha-1)/b <= 1 the argument of ln is written as 1 + (alpha
    expm1(x) + (alpha-1) expm1(-alpha/b)) / (2 alpha - 1) and passed to log1p, which stays accurate
    as alpha -> 1; otherwise the sum is taken in log space (logaddexp), which cannot overflow
    however large (alpha-1)/b is.
    """
    a = _check_alpha(alpha)
    t = 1.0 / _check_positive_finite(b, "the Laplace scale b")
    if a == 1.0:
        return t + math.expm1(-t)
    if math.isinf(a):
        return t
    am1 = a - 1.0
    if am1 * t <= 1.0:
        x = (a * math.expm1(am1 * t) + am1 * math.expm1(-a * t)) / (2.0 * a - 1.0)
        return math.log1p(x) / am1
    log_denominator = math.log(2.0 * a - 1.0)
    log_sum = np.logaddexp(
        math.log(a) - log_denominator + am1 * t,
        math.log(am1) - log_denominator - a * t,
    )
    return float(log_sum) / am1


def gaussian_rdp(alpha: float, sigma: float) -> float:
    """Rényi-DP of the Gaussian mechanism with L2 sensitivity 1 and standard deviation ``sigma``.

    Mironov 2017 (arXiv:1702.07476v3), Proposition 7: alpha / (2 sigma**2) for every alpha >= 1
    (alpha = 1 is the KL divergence); inf at alpha = inf. For sensitivity D use ``sigma / D``.
    """
    a = _check_alpha(alpha)
    s = _check_positive_finite(sigma, "the Gaussian standard deviation sigma")
    if math.isinf(a):
        return math.inf
    return a / (2.0 * s * s)


def pure_dp_rdp(alpha: float, epsilon: float) -> float:
    """The best Rényi-DP curve implied by pure epsilon-DP alone, at order ``alpha``.

    T. Steinke, "Sharp RDP & zCDP from Pure DP", differentialprivacy.org, 27 May 2024, Theorem 4
    (tight: randomized response attains it; the proof is a two-line Jensen argument):

        eps_hat(alpha) = epsilon - ln((1 + e^-epsilon) / (1 + e^-(2 alpha - 1) epsilon)) / (alpha-1)

    It is at most epsilon (an average privacy loss never exceeds its maximum) and at most
    alpha epsilon**2 / 2 (M. Bun and T. Steinke, "Concentrated Differential Privacy:
    Simplifications, Extensions, and Lower Bounds", TCC 2016, arXiv:1605.02065, Proposition 3.3).
    alpha = 1 gives epsilon tanh(epsilon/2), alpha = inf gives epsilon.
    """
    a = _check_alpha(alpha)
    eps = _check_positive_finite(epsilon, "epsilon")
    if a == 1.0:
        return eps * math.tanh(eps / 2.0)
    if math.isinf(a):
        return eps
    am1 = a - 1.0
    # ln((1+u)/(1+v)) with u = e^-eps, v = u e^{-2(alpha-1)eps}; u - v = u * -expm1(...) has no
    # cancellation, so the difference stays accurate as alpha -> 1.
    u = math.exp(-eps)
    v = u * math.exp(-2.0 * am1 * eps)
    log_ratio = math.log1p(u * -math.expm1(-2.0 * am1 * eps) / (1.0 + v))
    return max(0.0, eps - log_ratio / am1)


def discrete_laplace_rdp(alpha: float, b: float, shift: int = 1) -> float:
    """Exact Rényi divergence between two discrete Laplace distributions ``shift`` apart.

    P(x) = (1-q)/(1+q) q**|x| with q = exp(-1/b) (integers x), Q(x) = P(x - k), k = ``shift`` >= 0.
    Splitting the sum sum_x P(x)**alpha Q(x)**(1-alpha) at 0 and k gives three geometric series
    (derivation in the test suite):

        S = (1-q)/(1+q) * [ (q**((1-alpha) k) + q**(alpha k)) / (1-q)
                            + q**((1-alpha) k) * sum_{x=1}^{k-1} q**((2 alpha - 1) x) ]

    and D_alpha = ln(S) / (alpha - 1), evaluated in log space. alpha = 1 is the KL divergence
    (k - 2 q (1 - q**k) / (1 - q**2)) / b and alpha = inf is k / b.

    This is the curve of the discrete Laplace (two-sided geometric) mechanism of a query with
    integer sensitivity k; the result is rounded up by a few ulps and never exceeds the curve
    implied by its pure epsilon = k/b (:func:`pure_dp_rdp`), which is also a valid bound.
    """
    a = _check_alpha(alpha)
    t = 1.0 / _check_positive_finite(b, "the discrete Laplace scale b")
    if isinstance(shift, bool) or not isinstance(shift, int | np.integer) or shift < 0:
        raise ValueError(f"the shift must be a non-negative integer, got {shift!r}")
    k = int(shift)
    if k == 0:
        return 0.0
    kt = k * t
    if math.isinf(a):
        return kt
    if a == 1.0:
        one_minus_qk = -math.expm1(-kt)
        one_minus_q2 = -math.expm1(-2.0 * t)
        return t * (k - 2.0 * math.exp(-t) * one_minus_qk / one_minus_q2)
    order = a
    if a - 1.0 < _NEAR_ONE:
        # ln S is a difference of O(alpha k t) terms that vanishes as alpha -> 1, so dividing by a
        # tiny alpha - 1 would amplify its rounding error. D_alpha is nondecreasing in alpha, so
        # the value at 1 + _NEAR_ONE is an upper bound here, and only slightly larger.
        a = 1.0 + _NEAR_ONE
    am1 = a - 1.0
    log_one_minus_q = math.log(-math.expm1(-t))
    terms = [am1 * kt, -a * kt]
    if k >= 2:
        # ln sum_{x=1}^{k-1} r**x with r = q**(2 alpha - 1) = exp(-s):
        # ln r + ln(1 - r**(k-1)) - ln(1 - r), each factor via expm1 so tiny s stays accurate.
        s = (2.0 * a - 1.0) * t
        log_middle = -s + math.log(-math.expm1(-s * (k - 1))) - math.log(-math.expm1(-s))
        terms.append(am1 * kt + log_one_minus_q + log_middle)
    log_s = float(np.logaddexp.reduce(terms)) - math.log1p(math.exp(-t))
    # Round up: the terms have magnitude up to alpha k t and are summed with relative error ~ulp.
    margin = 8.0 * _ULP * (1.0 + a * kt) / am1
    exact = max(0.0, log_s / am1 + margin)
    return min(exact, pure_dp_rdp(order, kt))
