"""Noise distributions and their math: calibration, SQL renderings, error bounds, Rényi curves.

This package knows nothing about tables or the budget ledger. Each mechanism is an immutable
:class:`Mechanism` built by a ``from_sensitivity`` classmethod; it renders ``value + noise`` as a
sqlglot expression for DuckDB and Postgres (the database draws the noise with ``random()``), applies
the same noise in Python from ``os.urandom`` (``sample``), and reports its cost (``epsilon``,
``delta``, ``rdp(alpha)``) and accuracy (``error_bound``, ``variance``).

Shipped renderings (design section 6): :class:`DiscreteLaplace` for counts, :class:`Snapping` for
sums and averages. :class:`Laplace` is the reference continuous mechanism and :class:`Gaussian` the
(epsilon, delta) one.
"""

from mechanisms.base import Mechanism
from mechanisms.discrete_laplace import DiscreteLaplace
from mechanisms.gaussian import Gaussian
from mechanisms.laplace import Laplace
from mechanisms.randomness import secure_uniform
from mechanisms.rdp import discrete_laplace_rdp, gaussian_rdp, laplace_rdp, pure_dp_rdp
from mechanisms.snapping import Snapping

__all__ = [
    "DiscreteLaplace",
    "Gaussian",
    "Laplace",
    "Mechanism",
    "Snapping",
    "discrete_laplace_rdp",
    "gaussian_rdp",
    "laplace_rdp",
    "pure_dp_rdp",
    "secure_uniform",
]
