"""The continuous Laplace mechanism (reference only: its SQL rendering leaks low-order bits)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

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
from mechanisms.rdp import laplace_rdp

__all__ = ["Laplace"]

_SQL = f":v + :b * CASE WHEN RANDOM() < 0.5 THEN -1 ELSE 1 END * -LN({UNIFORM_SQL})"


@dataclass(frozen=True, kw_only=True)
class Laplace(Mechanism):
    """The Laplace mechanism: value + X with X ~ Laplace(0, b).

    Density: p(x) = exp(-|x| / b) / (2 b). Mean 0, variance 2 b**2, P(|X| > t) = exp(-t / b).

    Calibration: b = D / epsilon for a query of L1 sensitivity D gives epsilon-DP
    (C. Dwork, F. McSherry, K. Nissim, A. Smith, "Calibrating Noise to Sensitivity in Private Data
    Analysis", TCC 2006; C. Dwork and A. Roth, "The Algorithmic Foundations of Differential
    Privacy", 2014, Theorem 3.6). Rényi curve: Mironov, "Rényi Differential Privacy", CSF 2017,
    arXiv:1702.07476v3, Proposition 6 (:func:`mechanisms.rdp.laplace_rdp` at b / D).

    Only for reference and accounting: a floating-point Laplace sample reveals the exact answer
    through its low-order bits (I. Mironov, "On Significance of the Least Significant Bits for
    Differential Privacy", CCS 2012). Ship :class:`~mechanisms.snapping.Snapping` for real values
    and :class:`~mechanisms.discrete_laplace.DiscreteLaplace` for counts.

    SQL (design section 6): ``value + b * sign * -LN(1 - RANDOM())`` with a random sign; using
    ``1 - RANDOM()`` keeps the argument of LN in (0, 1] because RANDOM() is in [0, 1).
    """

    name: ClassVar[str] = "laplace"

    @classmethod
    def from_sensitivity(cls, sensitivity: float, epsilon: float) -> Laplace:
        """Calibrate to L1 ``sensitivity`` D and ``epsilon``: b = D / epsilon."""
        d = check_sensitivity(sensitivity)
        eps = check_epsilon(epsilon)
        return cls(sensitivity=d, epsilon=eps, scale=d / eps)

    def _check_calibration(self) -> None:
        # More noise than D / epsilon is allowed (it is still epsilon-DP); less is not.
        if self.scale < self.sensitivity / self.epsilon:
            raise ValueError(
                f"scale {self.scale!r} is below sensitivity / epsilon = "
                f"{self.sensitivity / self.epsilon!r}: the release would cost more than epsilon"
            )
        if self.delta != 0.0:
            raise ValueError("the Laplace mechanism is pure DP: delta must be 0")

    def error_bound(self, confidence: float = 0.95) -> float:
        """b ln(1 / (1 - confidence)), from P(|X| > t) = exp(-t / b)."""
        c = check_confidence(confidence)
        return -self.scale * math.log1p(-c)

    def variance(self) -> float:
        """2 b**2."""
        return 2.0 * self.scale * self.scale

    def render_sql(self, value: exp.Expr, dialect: str) -> exp.Expr:
        """``value + b * (±1) * -LN(1 - RANDOM())``, two independent draws."""
        check_dialect(dialect)
        return fill_template(_SQL, v=value, b=float_literal(self.scale))

    def sample(self, values: np.ndarray) -> np.ndarray:
        """values + Laplace(b) noise from os.urandom (float64)."""
        arr = check_values(values)
        n = arr.size
        noise = self.scale * secure_signs(n) * -np.log(secure_uniform_dense(n))
        return arr + noise.reshape(arr.shape)

    def rdp(self, alpha: float) -> float:
        """Mironov 2017, Proposition 6, at scale b / D."""
        return laplace_rdp(alpha, self.scale / self.sensitivity)
