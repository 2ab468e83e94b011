"""Mironov's snapping mechanism: Laplace noise hardened against floating-point attacks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
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
from mechanisms.randomness import secure_signs, secure_uniform_dense
from mechanisms.rdp import pure_dp_rdp

__all__ = ["DEFAULT_INFLATION", "Snapping"]

#: The share r of epsilon spent on floating-point slack: lambda' = (1 + r) / epsilon.
DEFAULT_INFLATION = 1e-3

# Mironov's theorem needs lambda < B < 2**46 lambda.
_MAX_B_OVER_LAMBDA = 2.0**46

# The whole mechanism on x = f / D, in Mironov's order of floating-point operations:
#   clamp_B(Lambda * round((clamp_B(x) + (S * lambda) * ln(U)) / Lambda)) * D.
# Dividing by the power of two Lambda is exact, so ROUND sees exactly (noisy x) / Lambda.
_SQL = (
    "LEAST(GREATEST(:Lam * ROUND("
    "(LEAST(GREATEST(CAST(:v AS DOUBLE) / :d, :neg_B), :B)"
    f" + CASE WHEN RANDOM() < 0.5 THEN :neg_one ELSE :one END * :lam * LN({UNIFORM_SQL})"
    ") / :Lam), :neg_B), :B) * :d"
)


def _power_of_two_ceil(x: float) -> float:
    """The smallest power of two >= x (x > 0), exactly."""
    mantissa, exponent = math.frexp(x)  # x = mantissa * 2**exponent, mantissa in [0.5, 1)
    return x if mantissa == 0.5 else math.ldexp(1.0, exponent)


def _slack(bound_unit: float) -> Fraction:
    """Exact floating-point slack, in units of 1/lambda, of the mechanism with clamp bound B'.

    2**-49 B' is the term of Mironov's Theorem 1, which takes x = f / D as an exact double. Here x
    is computed: the value is cast to double (exact for a DOUBLE, rounded for a large integer or a
    NUMERIC) and divided by D, two roundings that move x by at most |x| (2**-52 + 2**-106). Only
    inputs with |x| <= B' + 2 escape the clamp, so neighbours' inputs differ by at most
    1 + 2 (B' + 2)(2**-52 + 2**-106) = 1 + (B' + 2)(2**-51 + 2**-105). The privacy loss in
    Mironov's proof is |x - x'| / lambda plus the rounding term, so that stretch adds to the 1 of
    the sensitivity-1 case.
    """
    b = Fraction(bound_unit)
    return b / 2**49 + (b + 2) * (Fraction(1, 2**51) + Fraction(1, 2**105))


@dataclass(frozen=True, kw_only=True)
class Snapping(Mechanism):
    """The snapping mechanism (Laplace noise, clamped and rounded to a power-of-two grid).

    I. Mironov, "On Significance of the Least Significant Bits for Differential Privacy", ACM CCS
    2012, Section 5.2, Theorem 1: for a sensitivity-1 query f, lambda < B < 2**46 lambda, Lambda the
    smallest power of two >= lambda, S a uniform sign and U uniform on (0, 1) drawn as Mironov's U*,

        M(f) = clamp_B(Lambda * round((clamp_B(f) + S * lambda * ln(U)) / Lambda))

    is (1/lambda + 2**-49 B / lambda)-DP in IEEE double arithmetic. The analysis assumes a correctly
    rounded logarithm (such as CRlibm's); numpy and both databases call the C library's log, which
    is accurate to about an ulp but not guaranteed correctly rounded, a gap shared by every SQL
    rendering. Without the clamping and rounding, the low-order bits of a floating-point Laplace
    sample reveal the exact answer (Section 3 of the same paper).

    Density: before rounding the noise is Laplace, p(x) = exp(-|x| / lambda) / (2 lambda); the
    output is the nearest multiple of Lambda (clamped to [-B, B]). A query of sensitivity D is
    handled as D * M(f / D), so in the query's units the scale is b = D lambda, the step D Lambda,
    the bound D B.

    Calibration (``from_sensitivity``): the total epsilon equals the requested one. With the
    inflation r = 1e-3:

        lambda' = (1 + r) / epsilon, rounded up so that it holds exactly;
        Lambda' = the smallest power of two >= lambda';
        B'      = the largest multiple of Lambda' with slack(B') <= r, where
                  slack(B') = 2**-49 B' + (B' + 2)(2**-51 + 2**-105),
                  i.e. B' <= about (2**51 r - 2) / 5 (4.5e11 at r = 1e-3);

    so (1 + slack(B')) / lambda' <= epsilon, checked in exact rational arithmetic. Beyond Mironov's
    2**-49 B', the slack pays for rounding the value to double and dividing it by D (``_slack``).
    B' < 2**46 lambda' holds while r (32 epsilon - 5) < 5 (epsilon < ~156.6 at r = 1e-3); for
    larger epsilon r drops to 5 / (2 (32 epsilon - 5)), half the limit, so B' shrinks to about
    2**45 / epsilon. lambda' < B' needs epsilon > ~2.2e-12; smaller values raise ValueError.
    B' is a multiple of Lambda', so every output, clamped or not, is a multiple of D Lambda'.

    Variance and error: the noise is Laplace(b) plus a rounding error of at most Lambda/2, so
    P(|noise| <= b ln(1/(1-c)) + Lambda/2) >= c (ignoring the clamp, which only matters for
    |f| near D B'). ``variance`` returns 2 b**2 + Lambda**2 / 4, an upper bound on the variance
    (and on the mean squared error about f), checked numerically against the exact distribution for
    every offset of f within a step and every Lambda / lambda in [1, 2): the worst ratio is 0.93.

    Rényi curve: the mechanism is only known to be pure epsilon-DP, so ``rdp`` returns the best
    curve pure DP implies (T. Steinke, "Sharp RDP & zCDP from Pure DP", 2024, Theorem 4; see
    :func:`mechanisms.rdp.pure_dp_rdp`), which is at most epsilon. The Laplace curve at lambda' is
    not used: nothing shows the rounded, clamped output inherits it.

    Randomness: ``sample`` draws U as Mironov's U*
    (:func:`mechanisms.randomness.secure_uniform_dense`). The SQL rendering uses 1 - RANDOM(), a
    uniform on a 2**-52 grid (Postgres; DuckDB is no coarser near 0), so |S lambda ln U| <= 36.04
    lambda and each grid output's probability is off by less than 2**-52. At most 74 outputs have
    non-zero mass, so the output distribution is within total variation 2**-46 of the ideal one and
    the SQL rendering is (epsilon, 2**-46 (1 + e**epsilon))-DP.
    """

    name: ClassVar[str] = "snapping"

    Lambda: float
    bound: float
    inflation: float
    lambda_unit: float
    Lambda_unit: float
    bound_unit: float

    @classmethod
    def from_sensitivity(cls, sensitivity: float, epsilon: float) -> Snapping:
        """Calibrate to L1 ``sensitivity`` D so the total epsilon is ``epsilon`` (see class doc)."""
        d = check_sensitivity(sensitivity)
        eps = check_epsilon(epsilon)
        r = DEFAULT_INFLATION
        if r * (32.0 * eps - 5.0) >= 5.0:
            # B' would reach 2**46 lambda': give up part of the slack (half the limit keeps B' well
            # inside the range after it is rounded down to a multiple of Lambda').
            r = 5.0 / (2.0 * (32.0 * eps - 5.0))
        lam = (1.0 + r) / eps
        # Round lambda' up until lambda' >= (1 + r) / epsilon holds exactly, not just in floats.
        while Fraction(lam) * Fraction(eps) < 1 + Fraction(r):
            lam = math.nextafter(lam, math.inf)
        big_lam = _power_of_two_ceil(lam)
        bound_unit = big_lam * math.floor((math.ldexp(r, 51) - 2.0) / 5.0 / big_lam)
        # The float formula may round up; step down until the slack fits r exactly.
        while bound_unit > 0 and _slack(bound_unit) > Fraction(r):
            bound_unit -= big_lam
        if not lam < bound_unit < _MAX_B_OVER_LAMBDA * lam:
            raise ValueError(
                f"epsilon {epsilon!r} is outside the range the snapping mechanism supports "
                f"(about 2.2e-12 < epsilon); its clamp bound would not satisfy "
                f"lambda < B < 2**46 lambda"
            )
        return cls(
            sensitivity=d,
            epsilon=eps,
            scale=d * lam,
            Lambda=d * big_lam,
            bound=d * bound_unit,
            inflation=r,
            lambda_unit=lam,
            Lambda_unit=big_lam,
            bound_unit=bound_unit,
        )

    @property
    def guaranteed_epsilon(self) -> Fraction:
        """(1 + slack) / lambda' exactly: the epsilon the mechanism provably has (<= epsilon)."""
        return (1 + _slack(self.bound_unit)) / Fraction(self.lambda_unit)

    def _check_calibration(self) -> None:
        lam, big_lam, b = self.lambda_unit, self.Lambda_unit, self.bound_unit
        for label, value in (("lambda_unit", lam), ("Lambda_unit", big_lam), ("bound_unit", b)):
            if not math.isfinite(value) or value <= 0.0:
                raise ValueError(f"{label} must be a positive finite number, got {value!r}")
        if big_lam != _power_of_two_ceil(lam):
            raise ValueError(f"Lambda_unit {big_lam!r} is not the smallest power of two >= {lam!r}")
        if not lam < b < _MAX_B_OVER_LAMBDA * lam:
            raise ValueError(
                f"the bound {b!r} must satisfy lambda < B < 2**46 lambda (lambda={lam!r})"
            )
        if not (b / big_lam).is_integer():
            raise ValueError(f"the bound {b!r} must be a multiple of Lambda_unit {big_lam!r}")
        if self.guaranteed_epsilon > Fraction(self.epsilon):
            raise ValueError(
                f"this calibration is only {float(self.guaranteed_epsilon)!r}-DP, more than "
                f"epsilon {self.epsilon!r}"
            )
        d = self.sensitivity
        if (self.scale, self.Lambda, self.bound) != (d * lam, d * big_lam, d * b):
            raise ValueError("scale, Lambda and bound must be sensitivity times their unit values")
        if self.delta != 0.0:
            raise ValueError("the snapping mechanism is pure DP: delta must be 0")

    def error_bound(self, confidence: float = 0.95) -> float:
        """b ln(1/(1 - confidence)) + Lambda/2: the Laplace tail plus half a rounding step."""
        c = check_confidence(confidence)
        return -self.scale * math.log1p(-c) + self.Lambda / 2.0

    def variance(self) -> float:
        """An upper bound: 2 b**2 + Lambda**2 / 4; the exact value depends on f mod Lambda."""
        return 2.0 * self.scale * self.scale + self.Lambda * self.Lambda / 4.0

    def render_sql(self, value: exp.Expr, dialect: str) -> exp.Expr:
        """The snapping mechanism as one SQL expression (two RANDOM() draws: sign and U)."""
        check_dialect(dialect)
        return fill_template(
            _SQL,
            v=value,
            d=float_literal(self.sensitivity),
            B=float_literal(self.bound_unit),
            neg_B=float_literal(-self.bound_unit),
            lam=float_literal(self.lambda_unit),
            Lam=float_literal(self.Lambda_unit),
            one=float_literal(1.0),
            neg_one=float_literal(-1.0),
        )

    def sample(self, values: np.ndarray) -> np.ndarray:
        """The same computation in numpy float64, with U drawn as Mironov's U*."""
        arr = check_values(values)
        n = arr.size
        b, lam, big_lam = self.bound_unit, self.lambda_unit, self.Lambda_unit
        x = np.clip(arr.reshape(-1) / self.sensitivity, -b, b)
        noisy = x + (secure_signs(n) * lam) * np.log(secure_uniform_dense(n))
        snapped = np.clip(big_lam * np.rint(noisy / big_lam), -b, b)
        return (snapped * self.sensitivity).reshape(arr.shape)

    def rdp(self, alpha: float) -> float:
        """The Rényi curve implied by pure epsilon-DP (Steinke 2024, Theorem 4)."""
        return pure_dp_rdp(alpha, self.epsilon)

    def _extra_description(self) -> dict[str, Any]:
        return {"guaranteed_epsilon": float(self.guaranteed_epsilon)}
