"""Rényi curves: closed forms, limits, monotonicity, and agreement with brute-force divergences."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import discrete_laplace_rdp, gaussian_rdp, laplace_rdp, pure_dp_rdp

INF = math.inf
alphas = st.floats(min_value=1.0, max_value=256.0, allow_nan=False)
scales = st.floats(min_value=0.05, max_value=1e4, allow_nan=False)
epsilons = st.floats(min_value=1e-4, max_value=50.0, allow_nan=False)


# --- Laplace (Mironov 2017, Prop. 6) ---------------------------------------------------------


def test_laplace_rdp_at_alpha_2_by_hand() -> None:
    # alpha = 2, b = 1: 1/(2-1) * ln(2/3 * e**1 + 1/3 * e**-2)
    #   = ln(0.6666667 * 2.7182818 + 0.3333333 * 0.1353353) = ln(1.8121879 + 0.0451118)
    #   = ln(1.8572997) = 0.6191236
    assert laplace_rdp(2.0, 1.0) == pytest.approx(0.6191236299985928, rel=1e-12)
    # alpha = 2, b = 2: ln(2/3 e**0.5 + 1/3 e**-1) = ln(1.0991475 + 0.1226265) = ln(1.2217740)
    assert laplace_rdp(2.0, 2.0) == pytest.approx(math.log(1.2217740), rel=1e-6)


def test_laplace_rdp_limits() -> None:
    b = 3.0
    kl = 1.0 / b + math.exp(-1.0 / b) - 1.0  # alpha -> 1: KL(Lap(0,b) || Lap(1,b))
    assert laplace_rdp(1.0, b) == pytest.approx(kl, rel=1e-14)
    assert laplace_rdp(1.0 + 1e-9, b) == pytest.approx(kl, rel=1e-6)  # continuous at 1
    assert laplace_rdp(INF, b) == 1.0 / b  # max divergence = pure epsilon
    assert laplace_rdp(1e9, b) == pytest.approx(1.0 / b, rel=1e-6)


def test_laplace_rdp_large_inverse_scale_does_not_overflow() -> None:
    # 1/b = 1e4: exp((alpha-1)/b) = e**10000 overflows a double; the log-space form gives
    # ln(2/3) + 1e4 at alpha = 2 (the second term is e**-20000, negligible).
    assert laplace_rdp(2.0, 1e-4) == pytest.approx(1e4 + math.log(2.0 / 3.0), rel=1e-14)
    assert laplace_rdp(64.0, 1e-4) <= 1e4


@settings(max_examples=200, deadline=None)
@given(a1=alphas, a2=alphas, b=scales)
def test_laplace_rdp_monotone_in_alpha_and_below_pure(a1: float, a2: float, b: float) -> None:
    lo, hi = sorted((a1, a2))
    r_lo, r_hi = laplace_rdp(lo, b), laplace_rdp(hi, b)
    # Monotone in alpha up to float cancellation (eps - ln(...)/(alpha-1) loses ~1e-12
    # relative for tiny epsilon; hypothesis found 2e-12).
    assert 0.0 <= r_lo <= r_hi * (1 + 1e-9) + 1e-300
    # The exact curve never exceeds what its pure epsilon 1/b alone implies.
    assert r_hi <= pure_dp_rdp(hi, 1.0 / b) * (1 + 1e-9) + 1e-300


@settings(max_examples=25, deadline=None)
@given(
    a=st.floats(min_value=1.05, max_value=8.0),
    b=st.floats(min_value=0.3, max_value=5.0),
)
def test_laplace_rdp_matches_numerical_integration(a: float, b: float) -> None:
    integrate = pytest.importorskip("scipy.integrate")

    # D_alpha(Lap(0,b) || Lap(1,b)) = 1/(a-1) ln int p(x)**a q(x)**(1-a) dx
    def integrand(x: float) -> float:
        return math.exp(-(a * abs(x) + (1.0 - a) * abs(x - 1.0)) / b) / (2.0 * b)

    total = sum(
        integrate.quad(integrand, lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0]
        for lo, hi in ((-INF, 0.0), (0.0, 1.0), (1.0, INF))
    )
    assert laplace_rdp(a, b) == pytest.approx(math.log(total) / (a - 1.0), rel=1e-8, abs=1e-13)


# --- Gaussian (Mironov 2017, Prop. 7) --------------------------------------------------------


def test_gaussian_rdp_closed_form() -> None:
    assert gaussian_rdp(2.0, 1.0) == 1.0
    assert gaussian_rdp(8.0, 4.0) == 8.0 / 32.0
    assert gaussian_rdp(1.0, 2.0) == 1.0 / 8.0  # KL = 1/(2 sigma**2)
    assert gaussian_rdp(INF, 1.0) == INF


def test_gaussian_rdp_matches_numerical_integration() -> None:
    integrate = pytest.importorskip("scipy.integrate")
    a, s = 3.0, 1.5

    def integrand(x: float) -> float:
        log_p = -(x**2) / (2 * s * s)
        log_q = -((x - 1.0) ** 2) / (2 * s * s)
        return math.exp(a * log_p + (1 - a) * log_q) / (s * math.sqrt(2 * math.pi))

    total = integrate.quad(integrand, -INF, INF, epsabs=0, epsrel=1e-12)[0]
    assert gaussian_rdp(a, s) == pytest.approx(math.log(total) / (a - 1), rel=1e-9)


# --- pure DP -> RDP (Steinke 2024, Thm 4) ----------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(a1=alphas, a2=alphas, eps=epsilons)
def test_pure_dp_rdp_bounds(a1: float, a2: float, eps: float) -> None:
    lo, hi = sorted((a1, a2))
    r_lo, r_hi = pure_dp_rdp(lo, eps), pure_dp_rdp(hi, eps)
    # Monotone in alpha up to float cancellation (eps - ln(...)/(alpha-1) loses ~1e-12
    # relative for tiny epsilon; hypothesis found 2e-12).
    assert 0.0 <= r_lo <= r_hi * (1 + 1e-9) + 1e-300
    assert r_hi <= eps * (1 + 1e-12)  # pure DP bounds every order
    assert r_hi <= hi * eps * eps / 2 * (1 + 1e-9)  # Bun and Steinke 2016, Prop. 3.3


def test_pure_dp_rdp_is_randomized_response() -> None:
    # Tight for randomized response: P = Bern(e**eps / (e**eps + 1)), Q = Bern(1 / (e**eps + 1)).
    eps, a = 0.7, 3.0
    p1 = math.exp(eps) / (math.exp(eps) + 1)
    q1 = 1 - p1
    direct = math.log(p1**a * q1 ** (1 - a) + q1**a * p1 ** (1 - a)) / (a - 1)
    assert pure_dp_rdp(a, eps) == pytest.approx(direct, rel=1e-13)
    assert pure_dp_rdp(1.0, eps) == pytest.approx(eps * math.tanh(eps / 2), rel=1e-14)
    assert pure_dp_rdp(1.0 + 1e-10, eps) == pytest.approx(eps * math.tanh(eps / 2), rel=1e-6)
    assert pure_dp_rdp(INF, eps) == eps


# --- discrete Laplace ------------------------------------------------------------------------


def brute_force_discrete(a: float, b: float, k: int) -> float:
    """D_alpha between discrete Laplace(b) and its shift by k, summed over a truncated support."""
    q_log = -1.0 / b
    reach = int(80 * b) + k + 50  # mass beyond 80 b is below e**-80 relative to the total
    x = np.arange(-reach, reach + 1, dtype=np.float64)
    log_c = math.log(-math.expm1(q_log)) - math.log1p(math.exp(q_log))
    log_p = log_c + np.abs(x) * q_log
    log_q = log_c + np.abs(x - k) * q_log
    if a == 1.0:
        return float(np.sum(np.exp(log_p) * (log_p - log_q)))
    return float(np.logaddexp.reduce(a * log_p + (1 - a) * log_q)) / (a - 1)


@settings(max_examples=150, deadline=None)
@given(
    a=st.one_of(st.just(1.0), st.floats(min_value=1.01, max_value=64.0)),
    b=st.floats(min_value=0.2, max_value=20.0),
    k=st.integers(min_value=1, max_value=12),
)
def test_discrete_laplace_rdp_matches_brute_force(a: float, b: float, k: int) -> None:
    # Derivation of the closed form (x integer, q = e**(-1/b), c = (1-q)/(1+q)):
    #   x <= 0:      a|x| + (1-a)|x-k| = -x + (1-a)k  -> sum = q**((1-a)k) / (1-q)
    #   x >= k:      a x + (1-a)(x-k)  = x - (1-a)k   -> sum = q**(a k) / (1-q)
    #   0 < x < k:   (2a-1) x + (1-a) k              -> q**((1-a)k) sum_{x=1}^{k-1} q**((2a-1)x)
    expected = brute_force_discrete(a, b, k)
    got = discrete_laplace_rdp(a, b, k)
    assert got >= expected * (1 - 1e-10) - 1e-13  # rounded up, never below the truth
    assert got == pytest.approx(expected, rel=1e-8, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(a1=alphas, a2=alphas, b=st.floats(min_value=0.05, max_value=1e3), k=st.integers(1, 500))
def test_discrete_laplace_rdp_monotone_in_alpha_and_shift(
    a1: float, a2: float, b: float, k: int
) -> None:
    lo, hi = sorted((a1, a2))
    assert 0.0 <= discrete_laplace_rdp(lo, b, k) <= discrete_laplace_rdp(hi, b, k) * (1 + 1e-9)
    # Shift D is the worst case among shifts 1..D (the class relies on this).
    assert discrete_laplace_rdp(hi, b, k) <= discrete_laplace_rdp(hi, b, k + 1) * (1 + 1e-9)
    assert discrete_laplace_rdp(hi, b, k) <= pure_dp_rdp(hi, k / b) * (1 + 1e-12)


def test_discrete_laplace_rdp_limits_and_continuous_curve_is_not_a_bound() -> None:
    assert discrete_laplace_rdp(INF, 4.0, 3) == 0.75
    assert discrete_laplace_rdp(2.0, 4.0, 0) == 0.0
    # KL at shift 1 is (1/b) tanh(1/(2b)).
    assert discrete_laplace_rdp(1.0, 2.0, 1) == pytest.approx(0.5 * math.tanh(0.25), rel=1e-13)
    # Why DiscreteLaplace.rdp does not reuse the continuous Laplace curve: at the same scale the
    # discrete divergence is larger. At shift 1 every integer's privacy loss is exactly +-1/b, so
    # the mechanism is randomized response in disguise and meets the pure-DP curve (alpha = 2,
    # b = 1: 1 - ln((1 + e**-1) / (1 + e**-3)) = 0.7353), while the continuous curve gives 0.6191.
    assert discrete_laplace_rdp(2.0, 1.0, 1) == pytest.approx(pure_dp_rdp(2.0, 1.0), rel=1e-12)
    assert discrete_laplace_rdp(2.0, 1.0, 1) == pytest.approx(0.7353256640555192, rel=1e-12)
    assert discrete_laplace_rdp(2.0, 1.0, 1) > laplace_rdp(2.0, 1.0) + 0.1


# --- domains ---------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.5, 0.999, -1.0, math.nan, "two", None])
def test_bad_alpha_raises(alpha: object) -> None:
    for fn in (laplace_rdp, gaussian_rdp, pure_dp_rdp):
        with pytest.raises(ValueError, match="alpha"):
            fn(alpha, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        discrete_laplace_rdp(alpha, 1.0, 1)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, math.nan])
def test_bad_scale_raises(scale: float) -> None:
    for fn in (laplace_rdp, gaussian_rdp, pure_dp_rdp):
        with pytest.raises(ValueError):
            fn(2.0, scale)
    with pytest.raises(ValueError):
        discrete_laplace_rdp(2.0, scale, 1)


@pytest.mark.parametrize("shift", [-1, 1.5, True])
def test_bad_shift_raises(shift: object) -> None:
    with pytest.raises(ValueError, match="shift"):
        discrete_laplace_rdp(2.0, 1.0, shift)
