"""Calibration values computed by hand, exact error bounds, invariants, and domain errors."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from mechanisms import (
    DiscreteLaplace,
    Gaussian,
    Laplace,
    Mechanism,
    Snapping,
    discrete_laplace_rdp,
    gaussian_rdp,
    laplace_rdp,
    pure_dp_rdp,
)
from mechanisms.gaussian import gaussian_delta
from tests.mechanisms.stats import moments, snapped_distribution

PURE = (DiscreteLaplace, Laplace, Snapping)


def all_mechanisms() -> list[Mechanism]:
    return [
        DiscreteLaplace.from_sensitivity(10, 0.5),
        Laplace.from_sensitivity(10, 0.5),
        Snapping.from_sensitivity(200, 0.1),
        Gaussian.from_sensitivity(3, 0.5, 1e-6),
    ]


# --- discrete Laplace ------------------------------------------------------------------------


def test_discrete_laplace_calibration_by_hand() -> None:
    m = DiscreteLaplace.from_sensitivity(10, 0.5)
    # b = D / epsilon = 10 / 0.5 = 20; q = exp(-1/20) = 0.951229...
    assert (m.name, m.scale, m.epsilon, m.delta) == ("discrete_laplace", 20.0, 0.5, 0.0)
    q = math.exp(-1 / 20)
    assert m.ratio == q
    # variance 2q / (1-q)**2 = 1.902459 / 0.0023786 = 799.83 (just under the Laplace 2 b**2 = 800)
    assert m.variance() == pytest.approx(2 * q / (1 - q) ** 2, rel=1e-13)
    assert m.variance() == pytest.approx(799.8333541646, rel=1e-10)
    # P(|X| > t) = 2 q**(t+1) / (1+q) <= 0.05  <=>  t + 1 >= 20 ln(2 / (0.05 (1 + q))) = 60.01
    # so t + 1 = 61, t = 60.
    assert m.error_bound(0.95) == 60.0
    assert m.rdp(math.inf) == pytest.approx(0.5, rel=1e-15)
    assert m.rdp(2.0) == discrete_laplace_rdp(2.0, 20.0, 10)


@settings(max_examples=200, deadline=None)
@given(
    b=st.floats(min_value=0.1, max_value=60.0),
    c=st.floats(min_value=0.01, max_value=0.9999),
)
def test_discrete_laplace_error_bound_is_exact(b: float, c: float) -> None:
    m = DiscreteLaplace.from_sensitivity(1, 1 / b)
    t = int(m.error_bound(c))
    q = math.exp(-1 / m.scale)

    def coverage(t: int) -> float:  # P(|X| <= t) by direct summation of the mass function
        return (1 - q) / (1 + q) * (1 + 2 * sum(q**k for k in range(1, t + 1)))

    assert coverage(t) >= c - 1e-12
    assert t == 0 or coverage(t - 1) < c + 1e-12


def test_discrete_laplace_needs_integer_sensitivity_and_bounded_scale() -> None:
    with pytest.raises(ValueError, match="integer sensitivity"):
        DiscreteLaplace.from_sensitivity(2.5, 1.0)
    with pytest.raises(ValueError, match="overflow"):
        DiscreteLaplace.from_sensitivity(1e6, 1e-10)
    assert DiscreteLaplace.from_sensitivity(3.0, 1.0).sensitivity == 3.0


# --- Laplace ---------------------------------------------------------------------------------


def test_laplace_calibration_and_closed_forms() -> None:
    m = Laplace.from_sensitivity(10, 0.5)
    assert m.scale == 20.0
    assert m.variance() == 800.0  # 2 b**2
    # P(|X| > t) = exp(-t/b) = 0.05  <=>  t = b ln 20 = 20 * 2.9957323 = 59.914646
    assert m.error_bound(0.95) == pytest.approx(20 * math.log(20), rel=1e-14)
    assert m.error_bound(0.5) == pytest.approx(20 * math.log(2), rel=1e-14)
    assert m.rdp(2.0) == laplace_rdp(2.0, 2.0)  # b / D = 2
    assert m.rdp(math.inf) == 0.5


# --- snapping --------------------------------------------------------------------------------


def test_snapping_calibration_by_hand() -> None:
    m = Snapping.from_sensitivity(200, 0.1)
    # r = 1e-3; lambda' = (1 + r) / epsilon = 1.001 / 0.1 = 10.01 (rounded up to a double);
    # scale = D lambda' = 200 * 10.01 = 2002.0
    assert m.inflation == 1e-3
    assert m.lambda_unit == pytest.approx(10.01, rel=1e-15)
    assert Fraction(m.lambda_unit) * Fraction(0.1) >= Fraction(1.001)  # exactly, not in floats
    assert m.scale == pytest.approx(2002.0, rel=1e-15)
    # Lambda' = smallest power of two >= 10.01 = 16 (8 < 10.01 <= 16); Lambda = 200 * 16 = 3200
    assert (m.Lambda_unit, m.Lambda) == (16.0, 3200.0)
    # B' = largest multiple of 16 with 2**-49 B' + (B' + 2)(2**-51 + 2**-105) <= r, i.e. about
    #   B' <= (2**51 * 1e-3 - 2) / 5 = (2251799813685.248 - 2) / 5 = 450359962736.6496
    #   450359962736.6496 / 16 = 28147497671.04  ->  B' = 28147497671 * 16 = 450359962736
    assert m.bound_unit == 450359962736.0
    assert m.bound == 200 * 450359962736.0 == 90071992547200.0
    # Total epsilon (1 + slack(B')) / lambda' <= 0.1, and barely below it.
    assert m.guaranteed_epsilon <= Fraction(0.1)
    assert float(m.guaranteed_epsilon) == pytest.approx(0.1, rel=1e-9)
    assert m.error_bound(0.95) == pytest.approx(2002.0 * math.log(20) + 1600.0, rel=1e-14)
    assert m.variance() == pytest.approx(2 * 2002.0**2 + 3200.0**2 / 4, rel=1e-14)
    assert m.rdp(math.inf) == 0.1
    assert m.rdp(2.0) == pure_dp_rdp(2.0, 0.1)
    assert m.rdp(2.0) < 0.1


def test_snapping_large_epsilon_lowers_inflation() -> None:
    # At r = 1e-3, B' < 2**46 lambda' needs r (32 epsilon - 5) < 5, i.e. epsilon < 156.6;
    # at epsilon = 1000 r drops to 5 / (2 (32000 - 5)) = 7.8137e-5.
    m = Snapping.from_sensitivity(1, 1000)
    assert m.inflation == pytest.approx(5 / (2 * (32000 - 5)), rel=1e-15)
    assert m.lambda_unit < m.bound_unit < 2**46 * m.lambda_unit
    assert m.guaranteed_epsilon <= Fraction(1000)


@settings(max_examples=300, deadline=None)
@given(
    d=st.floats(min_value=1e-3, max_value=1e6),
    eps=st.floats(min_value=1e-11, max_value=1e5),
)
def test_snapping_invariants(d: float, eps: float) -> None:
    m = Snapping.from_sensitivity(d, eps)
    lam, big, b = m.lambda_unit, m.Lambda_unit, m.bound_unit
    assert lam <= big < 2 * lam and math.frexp(big)[0] == 0.5  # smallest power of two >= lambda
    assert lam < b < 2**46 * lam  # Mironov's Theorem 1 range
    assert (b / big).is_integer()  # clamped outputs stay on the grid
    assert m.guaranteed_epsilon <= Fraction(eps)  # the total never exceeds the request
    # It wastes only what rounding B' down to a multiple of Lambda' costs: at most one step, i.e.
    # (2**-49 + 2**-51) Lambda' = 10 2**-52 Lambda' of the slack (noticeable only at tiny epsilon).
    assert float(m.guaranteed_epsilon) >= eps * (1 - 10 * 2.0**-52 * big - 1e-12)
    assert m.scale == d * lam and m.Lambda == d * big and m.bound == d * b


def test_snapping_refuses_unsupported_epsilon() -> None:
    with pytest.raises(ValueError, match="snapping"):
        Snapping.from_sensitivity(1, 1e-13)


def test_snapping_variance_bound_holds_for_every_offset() -> None:
    # 2 b**2 + Lambda**2 / 4 bounds the variance (and the mean squared error about f) of the exact
    # snapped distribution for any position of f in the grid and any Lambda / lambda in [1, 2).
    worst = 0.0
    for ratio in np.linspace(1.0, 1.999, 12):
        step = ratio  # lambda = 1
        for offset in np.linspace(0.0, step, 13):
            values, probs = snapped_distribution(offset, 1.0, step)
            _, var, _ = moments(values, probs)
            mse = float(np.sum((values - offset) ** 2 * probs))
            worst = max(worst, var / (2 + step**2 / 4), mse / (2 + step**2 / 4))
    assert worst < 0.95


def test_snapping_rejects_inconsistent_fields() -> None:
    good = Snapping.from_sensitivity(200, 0.1).describe()
    fields = {k: good[k] for k in good if k not in ("name", "guaranteed_epsilon")}
    Snapping(**fields)  # round trip from describe()
    for change in (
        {"epsilon": 0.09},  # would under-report the cost
        {"bound_unit": fields["bound_unit"] + 8.0},  # off the grid
        {"Lambda_unit": 32.0},
        {"scale": 1000.0},
        {"delta": 1e-9},
    ):
        with pytest.raises(ValueError):
            Snapping(**{**fields, **change})


# --- Gaussian --------------------------------------------------------------------------------


def test_gaussian_classic_calibration_by_hand() -> None:
    m = Gaussian.classic(1, 0.5, 1e-6)
    # sigma = D sqrt(2 ln(1.25 / delta)) / epsilon = sqrt(2 ln 1.25e6) / 0.5
    #       = sqrt(2 * 14.038654) / 0.5 = 5.2988026 / 0.5 = 10.597605
    assert m.scale == pytest.approx(10.597605, rel=1e-7)
    assert m.calibration == "classic"
    assert m.variance() == pytest.approx(m.scale**2)
    assert m.rdp(2.0) == pytest.approx(2 / (2 * m.scale**2), rel=1e-15)
    with pytest.raises(ValueError, match="epsilon < 1"):
        Gaussian.classic(1, 1.0, 1e-6)


def test_gaussian_analytic_calibration() -> None:
    stats = pytest.importorskip("scipy.stats")
    optimize = pytest.importorskip("scipy.optimize")
    d, eps, delta = 3.0, 0.5, 1e-6
    m = Gaussian.from_sensitivity(d, eps, delta)
    assert (m.calibration, m.delta) == ("analytic", delta)

    # Independent root of Balle and Wang's Theorem 8 with scipy's normal CDF.
    def excess(sigma: float) -> float:
        a, c = d / (2 * sigma), eps * sigma / d
        return stats.norm.cdf(a - c) - math.exp(eps) * stats.norm.cdf(-a - c) - delta

    root = optimize.brentq(excess, 1e-3, 1e3, xtol=1e-14, rtol=1e-14)
    assert m.scale == pytest.approx(root, rel=1e-9)
    assert m.scale >= root * (1 - 1e-12)  # rounded towards more noise
    assert gaussian_delta(m.scale, d, eps) <= delta
    assert m.scale < Gaussian.classic(d, eps, delta).scale  # analytic beats the classic bound
    assert m.rdp(4.0) == pytest.approx(gaussian_rdp(4.0, m.scale / d), rel=1e-15)
    # Valid beyond epsilon = 1, where the classic bound does not apply.
    big = Gaussian.from_sensitivity(1, 5.0, 1e-9)
    assert gaussian_delta(big.scale, 1, 5.0) <= 1e-9 < gaussian_delta(big.scale * 0.999, 1, 5.0)


def test_gaussian_error_bound() -> None:
    stats = pytest.importorskip("scipy.stats")
    m = Gaussian.from_sensitivity(1, 0.5, 1e-6)
    for c in (0.5, 0.95, 0.999999):
        t = m.error_bound(c)
        assert 2 * stats.norm.cdf(t / m.scale) - 1 == pytest.approx(c, rel=1e-9)


def test_gaussian_rejects_undercalibrated_sigma() -> None:
    with pytest.raises(ValueError, match="delta"):
        Gaussian(sensitivity=1, epsilon=0.5, delta=1e-6, scale=1.0)
    for delta in (0.0, 1.0, -1e-9, math.nan):
        with pytest.raises(ValueError, match="delta"):
            Gaussian.from_sensitivity(1, 0.5, delta)


# --- shared contract -------------------------------------------------------------------------


@pytest.mark.parametrize("cls", PURE)
@pytest.mark.parametrize("eps", [0.0, -1.0, math.inf, math.nan, "x", None])
def test_bad_epsilon_raises(cls: type, eps: object) -> None:
    with pytest.raises(ValueError, match="epsilon"):
        cls.from_sensitivity(1, eps)
    with pytest.raises(ValueError, match="epsilon"):
        Gaussian.from_sensitivity(1, eps, 1e-6)


@pytest.mark.parametrize("cls", PURE)
@pytest.mark.parametrize("sens", [0.0, -2.0, math.inf, math.nan])
def test_bad_sensitivity_raises(cls: type, sens: float) -> None:
    with pytest.raises(ValueError, match="sensitivity"):
        cls.from_sensitivity(sens, 1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        Gaussian.from_sensitivity(sens, 0.5, 1e-6)


@pytest.mark.parametrize("cls", (DiscreteLaplace, Laplace))
def test_undercalibrated_scale_raises(cls: type) -> None:
    with pytest.raises(ValueError, match="more than epsilon"):
        cls(sensitivity=10, epsilon=1.0, scale=9.0)
    assert cls(sensitivity=10, epsilon=1.0, scale=11.0).scale == 11.0  # more noise is fine


@pytest.mark.parametrize("mech", all_mechanisms(), ids=lambda m: m.name)
def test_contract(mech: Mechanism) -> None:
    described = mech.describe()
    assert json.loads(json.dumps(described)) == described
    for key in ("name", "sensitivity", "epsilon", "delta", "scale"):
        assert key in described
    assert described["name"] == mech.name
    for c in (0.0, 1.0, 1.5, math.nan):
        with pytest.raises(ValueError, match="confidence"):
            mech.error_bound(c)
    assert 0 < mech.error_bound(0.5) < mech.error_bound(0.95) < mech.error_bound(0.999)
    assert mech.variance() > 0
    with pytest.raises(ValueError, match="dialect"):
        mech.render_sql(exp.column("x"), "mysql")
    with pytest.raises(ValueError, match="alpha"):
        mech.rdp(0.5)
    curve = [mech.rdp(a) for a in (1.0, 1.5, 2.0, 4.0, 16.0, 64.0)]
    assert curve == sorted(curve) and curve[0] >= 0
    if mech.delta == 0.0:
        assert mech.rdp(math.inf) <= mech.epsilon * (1 + 1e-12)
    with pytest.raises(ValueError, match="NaN"):
        mech.sample(np.array([1.0, math.nan]))
    with pytest.raises(dataclass_frozen_error()):
        mech.epsilon = 100.0  # type: ignore[misc]


def dataclass_frozen_error() -> type[Exception]:
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize("mech", all_mechanisms(), ids=lambda m: m.name)
def test_render_sql_shape(mech: Mechanism) -> None:
    value = sqlglot.parse_one("SUM(fare) - 1")
    before = value.sql()
    for dialect in ("duckdb", "postgres"):
        rendered = mech.render_sql(value, dialect)
        assert value.sql() == before  # the caller's tree is not modified
        sql = rendered.sql(dialect)
        # Re-parses in its dialect, keeps the value as one operand, draws twice per release.
        reparsed = sqlglot.parse_one(sql, read=dialect)
        assert len(list(reparsed.find_all(exp.Rand))) == 2
        assert "(SUM(fare) - 1)" in sql
        assert "LN(GREATEST(1 - RANDOM()" in sql  # LN never sees 0
