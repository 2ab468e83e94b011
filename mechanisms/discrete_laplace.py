"""The discrete Laplace (two-sided geometric) mechanism, for counts and other integer queries."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

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
from mechanisms.randomness import secure_uniform_dense
from mechanisms.rdp import discrete_laplace_rdp

__all__ = ["DiscreteLaplace"]

# Largest scale accepted: -b ln(U) with U >= 2**-1074 stays below 2**63 (744.5 b < 9.2e18), so the
# geometric draws always fit a BIGINT / int64 and the cast can never raise a data-independent error.
MAX_SCALE = 1e15

# G = FLOOR(b * -LN(1 - RANDOM())) counts failures before a success of probability 1 - exp(-1/b):
# P(G >= k) = P(1 - RANDOM() <= exp(-k/b)) = exp(-k/b). The difference of two independent draws is
# discrete Laplace. The value is cast too: a non-integral value would otherwise leak its fraction.
_SQL = (
    "CAST(:v AS BIGINT)"
    f" + CAST(FLOOR(:b * -LN({UNIFORM_SQL})) - FLOOR(:b * -LN({UNIFORM_SQL})) AS BIGINT)"
)


@dataclass(frozen=True, kw_only=True)
class DiscreteLaplace(Mechanism):
    """The discrete Laplace mechanism: value + X, X two-sided geometric on the integers.

    Density (probability mass), with b the scale and q = exp(-1/b):

        P(X = x) = (1 - q) / (1 + q) * q**|x|,   x in Z.

    Mean 0, variance 2 q / (1 - q)**2, P(|X| >= t) = 2 q**t / (1 + q) for integers t >= 1.

    Calibration: for an integer-valued query with integer L1 sensitivity D, b = D / epsilon (q =
    exp(-epsilon / D)) gives epsilon-DP: neighbouring outputs' probabilities differ by at most q**-D
    = e**epsilon. A. Ghosh, T. Roughgarden, M. Sundararajan, "Universally Utility-Maximizing Privacy
    Mechanisms", STOC 2009 (SIAM J. Comput. 41(6), 2012), the alpha-geometric mechanism; C. Canonne,
    G. Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020,
    arXiv:2004.00010 (the discrete Laplace, its privacy, and an exact sampler).

    Rényi curve: the exact Rényi divergence between two discrete Laplace distributions D apart
    (:func:`mechanisms.rdp.discrete_laplace_rdp`, a closed form). The continuous Laplace curve at
    the same b is *not* an upper bound (it is smaller at many orders), so it is not used. Shift D
    is the worst case among the integer shifts 1..D: the divergence is nondecreasing in the shift
    (checked by a property test, not proved here).

    SQL: the difference of two geometric draws, cast to BIGINT so the answer is an integer. The
    value is cast to BIGINT first (a count already is; a non-integral value is rounded).

    Exactness: the database's RANDOM() is a grid (Postgres: multiples of 2**-52; DuckDB is no
    coarser near 1), so each geometric draw's tail P(G >= k) is exp(-k/b) minus less than 2**-52,
    and draws above 36.04 b never happen. Each draw is therefore within total variation tau <=
    (36.04 b + 2) 2**-52 of the exact geometric, the noise within 2 tau, and the SQL rendering is
    (epsilon, 2 tau (1 + e**epsilon))-DP rather than pure (up to the rounding of LN): for b = 1000
    and epsilon <= 1 that delta is below 2e-10. ``sample`` draws Mironov's dense uniform
    (:func:`mechanisms.randomness.secure_uniform_dense`) instead, whose probabilities are exact up
    to a relative 2**-52, so the proxy-side mode has no such delta.
    """

    name: ClassVar[str] = "discrete_laplace"

    @classmethod
    def from_sensitivity(cls, sensitivity: float, epsilon: float) -> DiscreteLaplace:
        """Calibrate to integer L1 ``sensitivity`` D and ``epsilon``: b = D / epsilon."""
        d = check_sensitivity(sensitivity)
        eps = check_epsilon(epsilon)
        return cls(sensitivity=d, epsilon=eps, scale=d / eps)

    def _check_calibration(self) -> None:
        if not float(self.sensitivity).is_integer():
            raise ValueError(
                f"the discrete Laplace mechanism needs an integer sensitivity, got "
                f"{self.sensitivity!r}; use the snapping mechanism for real-valued queries"
            )
        if self.scale < self.sensitivity / self.epsilon:
            raise ValueError(
                f"scale {self.scale!r} is below sensitivity / epsilon = "
                f"{self.sensitivity / self.epsilon!r}: the release would cost more than epsilon"
            )
        if self.scale > MAX_SCALE:
            raise ValueError(
                f"scale {self.scale!r} exceeds {MAX_SCALE:g}: the noise could overflow a 64-bit "
                f"integer; raise epsilon or lower the sensitivity"
            )
        if self.delta != 0.0:
            raise ValueError("the discrete Laplace mechanism is pure DP: delta must be 0")

    @property
    def ratio(self) -> float:
        """q = exp(-1/b), the geometric ratio of the noise distribution."""
        return math.exp(-1.0 / self.scale)

    def _log_tail(self, t: int) -> float:
        """ln P(|X| > t) = ln(2 q**(t+1) / (1 + q)) for integers t >= 0."""
        return math.log(2.0) - (t + 1) / self.scale - math.log1p(self.ratio)

    def error_bound(self, confidence: float = 0.95) -> float:
        """The smallest integer t with P(|X| <= t) >= confidence (exact, not a tail bound)."""
        c = check_confidence(confidence)
        log_allowed = math.log1p(-c)  # ln(1 - confidence), accurate for confidence near 1
        # Solve ln 2 - (t+1)/b - ln(1+q) <= ln(1-c) for t, then settle the boundary exactly with the
        # same floating-point test, so rounding in the closed form cannot be off by one.
        guess = math.ceil(self.scale * (math.log(2.0) - math.log1p(self.ratio) - log_allowed)) - 1
        t = max(0, guess)
        while t > 0 and self._log_tail(t - 1) <= log_allowed:
            t -= 1
        while self._log_tail(t) > log_allowed:
            t += 1
        return float(t)

    def variance(self) -> float:
        """2 q / (1 - q)**2, with 1 - q computed by expm1 (accurate for large b)."""
        one_minus_q = -math.expm1(-1.0 / self.scale)
        return 2.0 * self.ratio / (one_minus_q * one_minus_q)

    def render_sql(self, value: exp.Expr, dialect: str) -> exp.Expr:
        """``CAST(value AS BIGINT) + CAST(G1 - G2 AS BIGINT)`` with two geometric draws."""
        check_dialect(dialect)
        return fill_template(_SQL, v=value, b=float_literal(self.scale))

    def sample(self, values: np.ndarray) -> np.ndarray:
        """round(values) + X as int64, with X drawn from os.urandom."""
        arr = check_values(values)
        if not np.isfinite(arr).all():
            raise ValueError("values must be finite for the discrete Laplace mechanism")
        n = arr.size
        g1 = np.floor(self.scale * -np.log(secure_uniform_dense(n)))
        g2 = np.floor(self.scale * -np.log(secure_uniform_dense(n)))
        noise = (g1 - g2).astype(np.int64).reshape(arr.shape)
        return np.rint(arr).astype(np.int64) + noise

    def rdp(self, alpha: float) -> float:
        """Exact Rényi divergence between discrete Laplace distributions D apart (see class doc)."""
        return discrete_laplace_rdp(alpha, self.scale, int(self.sensitivity))

    def _extra_description(self) -> dict[str, Any]:
        return {"ratio": self.ratio}
