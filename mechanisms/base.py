"""The abstract mechanism and the helpers its subclasses share.

A :class:`Mechanism` is an immutable record of one noisy release: which distribution, calibrated to
which sensitivity, at which privacy cost. Its meaning never changes once built (the budget ledger
stores ``describe()``); new behaviour gets a new class. Each instance checks in ``__post_init__``
that its noise really delivers the (epsilon, delta) it claims, so a hand-built or deserialised
instance cannot under-report its cost.
"""

from __future__ import annotations

import abc
import functools
import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
import sqlglot
from sqlglot import exp

from analyses.trees import copy_tree

__all__ = ["DIALECTS", "UNIFORM_SQL", "Mechanism"]

#: The SQL dialects every mechanism renders for.
DIALECTS = ("duckdb", "postgres")

#: A uniform draw on (0, 1] for use inside LN. RANDOM() is in [0, 1) in Postgres (a 52-bit grid), so
#: 1 - RANDOM() is never 0 there. DuckDB computes ldexp(uint64, -64), whose rounding to double
#: returns exactly 1.0 with probability about 2**-54; GREATEST with the smallest normal double keeps
#: LN finite (-708.4) instead of -inf, which would make a BIGINT cast fail. It never binds in
#: Postgres.
UNIFORM_SQL = "GREATEST(1 - RANDOM(), CAST('2.2250738585072014e-308' AS DOUBLE))"


def check_epsilon(epsilon: float) -> float:
    """Return ``epsilon`` as a float, or raise ``ValueError`` unless it is finite and > 0."""
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}") from None
    if not math.isfinite(eps) or eps <= 0.0:
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    return eps


def check_sensitivity(sensitivity: float) -> float:
    """Return ``sensitivity`` as a float, or raise ``ValueError`` unless it is finite and > 0.

    Sensitivity 0 is refused rather than mapped to "no noise": a zero bound nearly always means an
    analysis bug, and releasing an exact answer should be an explicit decision of the caller.
    """
    try:
        d = float(sensitivity)
    except (TypeError, ValueError):
        raise ValueError(
            f"sensitivity must be a positive finite number, got {sensitivity!r}"
        ) from None
    if not math.isfinite(d) or d <= 0.0:
        raise ValueError(f"sensitivity must be a positive finite number, got {sensitivity!r}")
    return d


def check_confidence(confidence: float) -> float:
    """Return ``confidence`` as a float, or raise ``ValueError`` unless 0 < confidence < 1."""
    try:
        c = float(confidence)
    except (TypeError, ValueError):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}") from None
    if not 0.0 < c < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return c


def check_dialect(dialect: str) -> str:
    """Return ``dialect`` or raise ``ValueError`` if no rendering exists for it."""
    if dialect not in DIALECTS:
        raise ValueError(f"unsupported SQL dialect {dialect!r}; expected one of {DIALECTS}")
    return dialect


def check_values(values: np.ndarray) -> np.ndarray:
    """Return ``values`` as a float64 array, or raise ``ValueError`` if any is NaN."""
    arr = np.asarray(values, dtype=np.float64)
    if np.isnan(arr).any():
        raise ValueError("values must not contain NaN (a query answer is never NULL here)")
    return arr


def float_literal(value: float) -> exp.Expr:
    """A SQL double constant that both databases parse to exactly ``value``.

    ``CAST('<repr>' AS DOUBLE)``: ``repr`` is the shortest decimal that round-trips, and both
    Postgres (strtod) and DuckDB parse a string to double with correct rounding. A bare literal
    would be NUMERIC in Postgres and DECIMAL in DuckDB, whose conversion to double may round twice.
    """
    if not math.isfinite(value):
        raise ValueError(f"cannot render the non-finite constant {value!r}")
    # Built as nodes: DataType.build("double") parses its text (about 45 us, 7 per snapping
    # rendering), and exp.cast copies its argument.
    return exp.Cast(this=exp.Literal.string(repr(float(value))),
                    to=exp.DataType(this=exp.DType.DOUBLE, nested=False))


# Nodes that bind tighter than any operator, so they never need parentheses as an operand.
_ATOMIC = (exp.Column, exp.Literal, exp.Func, exp.Paren, exp.Cast, exp.Placeholder)


@functools.lru_cache(maxsize=64)
def _parsed(template: str) -> exp.Expr:
    # Templates are a handful of constants: parse each once (callers get copies).
    tree = sqlglot.parse_one(template)
    # GREATEST and LEAST here clamp values that are never NULL (RANDOM(), literals, and the
    # measurement, which rewriters.noise passes as COALESCE(m, 0)): marked as the backends' own
    # functions (ignore_nulls), as Postgres renders them anyway.  Unmarked, sqlglot renders
    # each for DuckDB as CASE WHEN <arg> IS NULL ... ELSE GREATEST(<arg>, ...) END, repeating
    # the argument: the snapping mechanism's nested clamps wrote its noise 4 times per value.
    for node in tree.find_all(exp.Greatest, exp.Least):
        node.set("ignore_nulls", True)
    # The parser's positions (line, column) of each name and literal serve only its error
    # messages, and cost a dict copy per node in every copy of the template.
    for node in tree.walk():
        meta = node._meta
        if meta:
            for position in ("line", "col", "start", "end"):
                meta.pop(position, None)
            if not meta:
                node._meta = None
    return tree


def fill_template(template: str, **nodes: exp.Expr) -> exp.Expr:
    """Parse ``template`` (generic sqlglot SQL) and replace each ``:name`` with a copy of a node.

    Every occurrence gets its own copy, so no node is shared between two places of the tree, and a
    compound expression is parenthesised: ``:v * 2`` with ``v = a + b`` means ``(a + b) * 2``.
    """
    tree = _parsed(template).copy()

    def substitute(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Placeholder) and node.name in nodes:
            new = copy_tree(nodes[node.name])
            return new if isinstance(new, _ATOMIC) else exp.Paren(this=new)
        return node

    result = tree.transform(substitute, copy=False)
    missing = [p.name for p in result.find_all(exp.Placeholder)]
    if missing:
        raise ValueError(f"template placeholders left unfilled: {missing}")
    return result


@dataclass(frozen=True, kw_only=True)
class Mechanism(abc.ABC):
    """An additive noise mechanism calibrated for one release.

    Attributes:
        name: the mechanism's identifier in reports and the ledger.
        sensitivity: L1 sensitivity of the protected query (L2 for the Gaussian), in its own units.
        epsilon: the epsilon this release costs, exactly what the caller asked for.
        scale: the noise scale b in the query's units (the standard deviation sigma for Gaussian).
        delta: the delta this release costs; 0.0 for the pure-DP mechanisms.

    Build instances with the subclass's ``from_sensitivity`` classmethod; the constructor only
    checks that the given fields are consistent and deliver the claimed privacy.
    """

    name: ClassVar[str]

    sensitivity: float
    epsilon: float
    scale: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        check_sensitivity(self.sensitivity)
        check_epsilon(self.epsilon)
        if not math.isfinite(self.scale) or self.scale <= 0.0:
            raise ValueError(f"scale must be a positive finite number, got {self.scale!r}")
        if not 0.0 <= self.delta < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {self.delta!r}")
        self._check_calibration()

    @abc.abstractmethod
    def _check_calibration(self) -> None:
        """Raise ``ValueError`` unless the noise delivers (epsilon, delta) at this sensitivity."""

    @abc.abstractmethod
    def error_bound(self, confidence: float = 0.95) -> float:
        """The smallest t with P(|noise| <= t) >= ``confidence``, in the query's units."""

    @abc.abstractmethod
    def variance(self) -> float:
        """The variance of the noise, in the query's units squared."""

    @abc.abstractmethod
    def render_sql(self, value: exp.Expr, dialect: str) -> exp.Expr:
        """Return a SQL expression computing ``value`` plus this noise inside the database.

        ``value`` is a non-NULL numeric expression (it is copied, never modified); ``dialect`` is
        ``"duckdb"`` or ``"postgres"``. Each ``RANDOM()`` in the result is an independent draw, so
        the expression must be evaluated once per released value.
        """

    @abc.abstractmethod
    def sample(self, values: np.ndarray) -> np.ndarray:
        """Apply the mechanism to each of ``values`` in Python, with randomness from os.urandom."""

    @abc.abstractmethod
    def rdp(self, alpha: float) -> float:
        """The Rényi-DP epsilon of this release at order ``alpha`` (alpha >= 1, or inf)."""

    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable description: name, every field, and derived values."""
        out: dict[str, Any] = {"name": self.name}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = float(value) if isinstance(value, int | float) else value
        out.update(self._extra_description())
        return out

    def _extra_description(self) -> dict[str, Any]:
        return {}
