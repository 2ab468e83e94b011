"""Statistical helpers for the mechanisms tests: draws from each backend and tolerance checks.

Tolerances. For n i.i.d. draws with variance v and fourth central moment mu4, the sample mean has
standard error sqrt(v / n) and the sample variance sqrt((mu4 - v**2) / n) (the variance of s**2 to
first order). Every check allows Z = 6 standard errors: under the normal approximation (n = 200000
makes it accurate even for the Laplace's excess kurtosis 3), one check fails by chance with
probability 2 Phi(-6) = 2.0e-9, so the whole suite (under 100 such checks) has a false-failure rate
below 2e-7. mu4 is computed exactly per distribution, which matters for the discrete Laplace with a
small scale (mostly zeros, kurtosis far above the Laplace's 6).

The SQL draws are seeded (setseed) for reproducibility; the Python draws come from os.urandom by
design and cannot be seeded.
"""

from __future__ import annotations

import math

import numpy as np
from sqlglot import exp

from mechanisms import Mechanism
from mechanisms.base import float_literal

N = 200_000
Z = 6.0
SEED = 0.125

SOURCES = ("python", "duckdb", "postgres")


def value_expr(value: float) -> exp.Expr:
    """A SQL constant that both databases read as exactly ``value``."""
    if isinstance(value, int):
        return exp.Literal.number(value)
    return float_literal(value)


def draw(mech: Mechanism, value: float, source: str, con: object = None, n: int = N) -> np.ndarray:
    """``n`` independent releases of ``value`` through ``mech`` on one backend."""
    if source == "python":
        return mech.sample(np.full(n, value, dtype=np.float64))
    if source == "duckdb":
        con.execute(f"SELECT setseed({SEED})").fetchall()
        sql = mech.render_sql(value_expr(value), "duckdb").sql("duckdb")
        return con.sql(f"SELECT {sql} AS x FROM range({n})").fetchnumpy()["x"]
    if source == "postgres":
        con.execute(f"SELECT setseed({SEED})")
        sql = mech.render_sql(value_expr(value), "postgres").sql("postgres")
        rows = con.execute(f"SELECT {sql} AS x FROM generate_series(1, {n})").fetchall()
        return np.array([r[0] for r in rows])
    raise AssertionError(source)


def check_moments(noise: np.ndarray, mean: float, var: float, mu4: float, what: str = "") -> None:
    """Assert the sample mean and variance of ``noise`` are within Z standard errors."""
    n = noise.size
    noise = noise.astype(np.float64)
    se_mean = math.sqrt(var / n)
    se_var = math.sqrt((mu4 - var * var) / n)
    got_mean, got_var = float(noise.mean()), float(noise.var())
    assert abs(got_mean - mean) <= Z * se_mean, (
        f"{what}: mean {got_mean} vs {mean} (tolerance {Z * se_mean})"
    )
    assert abs(got_var - var) <= Z * se_var, (
        f"{what}: variance {got_var} vs {var} (tolerance {Z * se_var})"
    )


def check_proportion(hits: int, n: int, p: float, what: str = "") -> None:
    """Assert a binomial proportion hits/n is within Z standard errors of p."""
    se = math.sqrt(p * (1.0 - p) / n)
    assert abs(hits / n - p) <= Z * se, f"{what}: proportion {hits / n} vs {p} (tolerance {Z * se})"


def laplace_cdf(x: np.ndarray, b: float) -> np.ndarray:
    """P(L <= x) for L ~ Laplace(0, b)."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(
        x < 0, 0.5 * np.exp(np.minimum(x, 0.0) / b), 1.0 - 0.5 * np.exp(-np.maximum(x, 0.0) / b)
    )


def snapped_distribution(f: float, b: float, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and probabilities of step * round((f + L) / step), L ~ Laplace(b), no clamping.

    P(out = k step) = P((k - 1/2) step <= f + L < (k + 1/2) step): the ideal snapping output in
    real arithmetic (ties and floating-point effects have probability ~2**-52).
    """
    centre = round(f / step)
    reach = math.ceil(60.0 * b / step) + 2  # the Laplace mass beyond 60 b is e**-60
    k = np.arange(centre - reach, centre + reach + 1, dtype=np.float64)
    probs = laplace_cdf((k + 0.5) * step - f, b) - laplace_cdf((k - 0.5) * step - f, b)
    return k * step, probs


def moments(values: np.ndarray, probs: np.ndarray) -> tuple[float, float, float]:
    """Mean, variance and fourth central moment of a finite distribution."""
    mean = float(np.sum(values * probs))
    centred = values - mean
    return mean, float(np.sum(centred**2 * probs)), float(np.sum(centred**4 * probs))


def discrete_laplace_moments(b: float) -> tuple[float, float]:
    """Variance and fourth moment of the discrete Laplace with q = exp(-1/b).

    With P(|X| = k) = 2 (1-q)/(1+q) q**k for k >= 1 and the Eulerian-number sums
    sum k**2 q**k = q (1+q) / (1-q)**3, sum k**4 q**k = q (1 + 11q + 11q**2 + q**3) / (1-q)**5:
    E X**2 = 2q / (1-q)**2 and E X**4 = 2q (1 + 11q + 11q**2 + q**3) / ((1+q)(1-q)**4).
    """
    q = math.exp(-1.0 / b)
    var = 2.0 * q / (1.0 - q) ** 2
    mu4 = 2.0 * q * (1.0 + 11.0 * q + 11.0 * q * q + q**3) / ((1.0 + q) * (1.0 - q) ** 4)
    return var, mu4
