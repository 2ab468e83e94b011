"""Large-sample tests: rendered SQL run for real on DuckDB and Postgres, and ``sample`` in Python.

Each test draws N = 200000 releases of a fixed value and compares the empirical noise with the exact
distribution, allowing 6 standard errors (derivation and false-failure rate in ``stats.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from mechanisms import DiscreteLaplace, Gaussian, Laplace, Mechanism, Snapping, secure_uniform
from mechanisms.randomness import secure_signs, secure_uniform_dense
from tests.mechanisms.stats import (
    N,
    check_moments,
    check_proportion,
    discrete_laplace_moments,
    draw,
    moments,
    snapped_distribution,
)

SOURCES = [
    pytest.param("python", id="python"),
    pytest.param("duckdb", id="duckdb"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


Releases = Callable[..., np.ndarray]


@pytest.fixture
def releases(request: pytest.FixtureRequest) -> Releases:
    """``releases(mech, value)``: N releases of ``value`` from the source under test."""
    source = request.param
    con = None
    if source == "duckdb":
        con = request.getfixturevalue("duck")
    elif source == "postgres":
        con = request.getfixturevalue("pg")

    def run(mech: Mechanism, value: float, n: int = N) -> np.ndarray:
        return draw(mech, value, source, con, n)

    return run


def parametrize_sources(fn: Callable[..., None]) -> Callable[..., None]:
    """Run a test once per source: Python, DuckDB, Postgres (marked ``postgres``)."""
    return pytest.mark.parametrize("releases", SOURCES, indirect=True)(fn)


# --- discrete Laplace ------------------------------------------------------------------------


@parametrize_sources
def test_discrete_laplace_moments_and_integrality(releases: Releases) -> None:
    m = DiscreteLaplace.from_sensitivity(10, 0.5)  # b = 20
    out = releases(m, 1234)
    assert np.issubdtype(out.dtype, np.integer)  # BIGINT / int64, not a float that looks whole
    var, mu4 = discrete_laplace_moments(m.scale)
    assert var == pytest.approx(m.variance(), rel=1e-12)
    check_moments(out - 1234, 0.0, var, mu4, "discrete Laplace b=20")
    inside = int(np.sum(np.abs(out - 1234) <= m.error_bound(0.95)))
    q = m.ratio
    coverage = 1 - 2 * q ** (m.error_bound(0.95) + 1) / (1 + q)  # exact P(|X| <= t)
    check_proportion(inside, out.size, coverage, "discrete Laplace 95% bound")


@parametrize_sources
def test_discrete_laplace_mass_function(releases: Releases) -> None:
    # A small scale puts visible mass on each of -2..2: P(X = x) = (1-q)/(1+q) q**|x|.
    # This catches an off-by-one geometric (CEIL for FLOOR, or counting trials not failures).
    m = DiscreteLaplace.from_sensitivity(1, 1.2)  # b = 1/1.2, q = exp(-1.2) = 0.301
    noise = releases(m, 7) - 7
    q = m.ratio
    for x in range(-3, 4):
        p = (1 - q) / (1 + q) * q ** abs(x)
        check_proportion(int(np.sum(noise == x)), noise.size, p, f"P(X = {x})")
    var, mu4 = discrete_laplace_moments(m.scale)
    check_moments(noise, 0.0, var, mu4, "discrete Laplace b=1/1.2")


@parametrize_sources
def test_discrete_laplace_rounds_a_fractional_value(releases: Releases) -> None:
    m = DiscreteLaplace.from_sensitivity(1, 50.0)  # q = e**-50: essentially no noise
    out = releases(m, 41.75, n=1000)
    assert np.issubdtype(out.dtype, np.integer)
    assert np.all(out == 42)  # the fraction never leaks


# --- snapping --------------------------------------------------------------------------------


@parametrize_sources
def test_snapping_moments_and_grid(releases: Releases) -> None:
    m = Snapping.from_sensitivity(200, 0.1)  # b = 2002, Lambda = 3200
    f = 12345.6
    out = releases(m, f)
    # Every output is a multiple of D * Lambda' = 3200 (exactly: 16 k * 200 is an integer).
    steps = out / m.Lambda
    assert np.all(steps == np.round(steps))
    # The rounding makes the mean slightly biased for this f (grid not centred on it), so compare
    # with the exact distribution of the snapped output rather than with 0 and 2 b**2.
    values, probs = snapped_distribution(f, m.scale, m.Lambda)
    mean, var, mu4 = moments(values, probs)
    check_moments(out, mean, var, mu4, "snapping D=200 eps=0.1")
    assert var <= m.variance()  # variance() is an upper bound
    inside = int(np.sum(np.abs(out - f) <= m.error_bound(0.95)))
    exact = float(np.sum(probs[np.abs(values - f) <= m.error_bound(0.95)]))
    assert exact >= 0.95
    check_proportion(inside, out.size, exact, "snapping 95% bound")


@parametrize_sources
def test_snapping_non_integer_sensitivity(releases: Releases) -> None:
    m = Snapping.from_sensitivity(0.3, 2.0)
    f = 1.0
    out = releases(m, f)
    steps = out / m.Lambda
    np.testing.assert_allclose(steps, np.round(steps), rtol=0, atol=1e-9)
    values, probs = snapped_distribution(f, m.scale, m.Lambda)
    mean, var, mu4 = moments(values, probs)
    check_moments(out, mean, var, mu4, "snapping D=0.3 eps=2")


@parametrize_sources
def test_snapping_clamps_at_the_bound(releases: Releases) -> None:
    m = Snapping.from_sensitivity(200, 0.1)
    for sign in (1.0, -1.0):
        out = releases(m, sign * 1e20, n=20000)
        # f / D is clamped to B' (a multiple of Lambda'); noise pushing outward is clamped again and
        # noise within half a step inward rounds back, so P(out = bound) = 1 - e**(-Lambda/2b) / 2.
        assert np.all(np.abs(out) <= m.bound)
        at_bound = int(np.sum(out == sign * m.bound))
        p = 1 - 0.5 * math.exp(-m.Lambda / (2 * m.scale))
        check_proportion(at_bound, out.size, p, "P(out = bound)")
        assert np.all(np.abs(out - sign * m.bound) <= 40 * m.scale + m.Lambda)
        assert np.all(out / m.Lambda == np.round(out / m.Lambda))


# --- Laplace and Gaussian --------------------------------------------------------------------


@parametrize_sources
def test_laplace_moments_and_tail(releases: Releases) -> None:
    m = Laplace.from_sensitivity(10, 0.5)  # b = 20
    noise = releases(m, 0.0)
    # Laplace: variance 2 b**2, fourth moment 24 b**4 (kurtosis 6).
    check_moments(noise, 0.0, m.variance(), 24 * m.scale**4, "Laplace b=20")
    for t in (10.0, 40.0, 100.0):
        check_proportion(int(np.sum(np.abs(noise) > t)), noise.size, math.exp(-t / 20), f"tail {t}")


@parametrize_sources
def test_gaussian_moments_and_coverage(releases: Releases) -> None:
    m = Gaussian.from_sensitivity(3, 0.5, 1e-6)
    noise = releases(m, 5.0) - 5.0
    check_moments(noise, 0.0, m.variance(), 3 * m.scale**4, "Gaussian")
    inside = int(np.sum(np.abs(noise) <= m.error_bound(0.95)))
    check_proportion(inside, noise.size, 0.95, "Gaussian 95% bound")


# --- randomness ------------------------------------------------------------------------------


def test_secure_uniform() -> None:
    u = secure_uniform(N)
    assert u.shape == (N,) and u.dtype == np.float64
    assert np.all((u > 0) & (u <= 1))
    assert np.all(u * 2.0**53 == np.round(u * 2.0**53))  # 53-bit grid
    check_moments(u, 0.5, 1 / 12, 1 / 80, "uniform")  # central moments of U(0,1)
    assert secure_uniform(0).shape == (0,)
    with pytest.raises(ValueError):
        secure_uniform(-1)


def test_secure_uniform_dense() -> None:
    u = secure_uniform_dense(N)
    assert np.all((u > 0) & (u < 1))
    check_moments(u, 0.5, 1 / 12, 1 / 80, "dense uniform")
    # Binades: P(U < 2**-k) = 2**-k.
    for k in (1, 3, 8):
        check_proportion(int(np.sum(u < 2.0**-k)), N, 2.0**-k, f"P(U < 2**-{k})")
    # Small values keep full precision: below 2**-20 they are not on the 2**-53 grid.
    small = secure_uniform_dense(4 * N)
    small = small[small < 2.0**-8]
    off_grid = np.mean(small * 2.0**53 != np.round(small * 2.0**53))
    assert off_grid > 0.9
    # -ln(U) is Exponential(1): the tail P(-ln U > 12) = e**-12 stays faithful.
    e = -np.log(secure_uniform_dense(N))
    check_moments(e, 1.0, 1.0, 9.0, "exponential")


def test_secure_signs() -> None:
    s = secure_signs(N)
    assert set(np.unique(s)) == {-1.0, 1.0}
    check_proportion(int(np.sum(s > 0)), N, 0.5, "signs")
