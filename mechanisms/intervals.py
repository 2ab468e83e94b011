"""95% intervals for output columns computed from noisy measurements, and their presentation.

An output column is a sqlglot expression over measurement ids (``m0``, ``m1``, ...) and group-key
ids (``k0``), evaluated after the noise is added (``analyses.query.OutputColumn``): COUNT is
``m0``, AVG is ``LEAST(GREATEST(c + m1 / GREATEST(m0, 1), l), u)``, VARIANCE is
``(m2 - m1 * m1 / n) / (n - 1)`` clamped, and analysts add arithmetic, ROUND, CASE and so on.
:func:`output_intervals` gives each released row of such a column an interval that contains the
value the expression takes on the *exact* measurements with probability about 95% over the noise.
Computing it is post-processing of released values: it costs no privacy budget.

Method
------
Each measurement's noise is known exactly: its mechanism says which distribution and which scale.

*Exact (one measurement).*  When the expression reads a single noisy measurement y = x + e, the
mechanism's own bound t (``Mechanism.error_bound``: P(|e| <= t) >= 95%, exact for the discrete
Laplace, conservative for snapping) gives a box [y - t, y + t] that holds x with probability
>= 95%.  Evaluating the expression over that box in interval arithmetic encloses every value it
can take there, so the result holds the true output with probability >= 95%, whatever the
expression (no linearisation: this is the delta method made exact).

*Simulation (several measurements).*  A parametric bootstrap: draw e* from each measurement's
noise distribution (``draws`` times, 2,000 by default, vectorised), evaluate the expression at
y - e* and take order statistics.  With ranks r = floor(alpha/2 (n + 1)) and s = n + 1 - r the
interval [F*_(r), F*_(s)] holds a fresh draw of the same pivot with probability exactly
(s - r) / (n + 1) >= 1 - alpha (exchangeability; 1901 / 2001 for n = 2000).  For an expression
that is a monotone function of a linear combination of the measurements (COUNT, SUM, their sums
and differences, scaled) the pivot is exact, so the coverage is >= 95% for every true value.  For
other expressions (AVG's ratio, VARIANCE) it is the percentile bootstrap, accurate when the noise
is small next to the measurements; where it is not (a denominator whose interval reaches 0) the
interval is unbounded instead of narrow.  The coverage tests
(``tests/mechanisms/test_interval_coverage.py``) measure 96.7-99.6% for AVG, VARIANCE, STDDEV
and a ratio of sums over 4,000 releases each, from 100 to 2,000 rows and epsilon 0.1 to 1.
The simulation was chosen over the delta method because it needs no derivatives, handles
clamps, CASE and rounding as they are, and does not assume normal noise (the noise is Laplace).

The snapping mechanism rounds to a grid of step Lambda (between b and 2 b): its noise is Laplace
plus a rounding error in [-Lambda/2, Lambda/2] that depends on the unknown true value, so a
simulation drawing "Laplace, rounded" would under-cover some true values (down to about 91% at
the worst offsets).  Each simulated snapped measurement is therefore the box y - L* +-
Lambda / 2 and the expression is evaluated in interval arithmetic over the boxes: the lower end
is the r-th smallest lower bound, the upper end the s-th smallest upper bound.  (Noise clamping
at +-D B', about 4.5e11 D, is ignored: it never binds for real data.)

Division.  A quotient whose denominator's 95% range reaches 0 has no honest bound (the ratio can
be arbitrarily large or change sign): every draw of it becomes (-inf, inf), and the interval says
so in its notes.  The check looks through the guards the analyser and ``rewriters.safety`` add
(``GREATEST(n, 1)``, ``NULLIF(n, 0)``): they keep the SQL defined, not the ratio meaningful.
A clamp applied afterwards (AVG is clamped into its declared bounds) then turns the unbounded
interval into that declared range, which is the honest answer.

Unknown node kinds, strings, NULL and modulo of a noisy value return :class:`NoInterval`:
no interval rather than a wrong one.

The draws come from numpy's generator, not ``os.urandom``: they are post-processing of released
values and protect nothing (``mechanisms.randomness`` rules out numpy for the noise itself).

Selection.  The coverage is over the noise of one row taken as it comes.  Rows kept *because of*
their noisy values (the key-release threshold, HAVING on an aggregate, ORDER BY an aggregate with
LIMIT) are more likely to carry noise in the direction that kept them: near the cut their
intervals cover less often, and a report should say so rather than rely on them.

Post-processing users expect
----------------------------
Counts are clamped at 0 and rounded to integers (:func:`clamp_count`); :func:`postprocessed`
applies the same clamp (and, for integer truths, rounding inwards) to an interval.  Clamping and
rounding are monotone and leave the truth unchanged (a count is a non-negative integer), so the
post-processed interval holds the truth whenever the raw one does: the coverage is unchanged and
the interval only gets narrower.

Bias
----
Caps on rows per unit and clipping bounds change the quantity measured: the noise interval covers
the capped/clipped value, not the true one.  :func:`with_bias` widens an interval on one side by a
relative bias bound ("the answer may be up to 3% low"), and :func:`format_interval` shows both:
``5,112 ± 140 (noise), up to 3% low (trips above the cap)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from sqlglot import exp

from mechanisms.base import Mechanism, check_confidence
from mechanisms.discrete_laplace import DiscreteLaplace
from mechanisms.gaussian import Gaussian
from mechanisms.laplace import Laplace
from mechanisms.snapping import Snapping

__all__ = [
    "DEFAULT_DRAWS",
    "WORK_BUDGET",
    "Bias",
    "Interval",
    "NoInterval",
    "clamp_count",
    "draws_for",
    "format_interval",
    "output_interval",
    "output_intervals",
    "postprocessed",
    "with_bias",
]

#: Simulated draws per released row: a fixed cost, and order-statistic coverage 1901/2001.
DEFAULT_DRAWS = 2000

#: Rows x draws per output column when the caller does not fix ``draws``: a result of many rows
#: gets fewer draws each (never fewer than the confidence needs), so the cost stays about 1 s.
WORK_BUDGET = 2_000_000

# Rows x draws per evaluation chunk: bounds the memory of one intermediate array (8 MB).
_CHUNK_ELEMENTS = 1 << 20

UNBOUNDED_DENOMINATOR = (
    "a denominator's 95% interval reaches 0 at this epsilon: the ratio has no bound"
)


@dataclass(frozen=True)
class Bias:
    """A bound on the systematic error of an answer, relative to the true value.

    ``direction`` "low": the answer may be below the truth by up to ``fraction`` of |truth|
    (rows dropped by a cap, values clipped down); "high": above it.  ``reason`` is shown to the
    user, e.g. "trips above the cap".
    """

    direction: Literal["low", "high"]
    fraction: float
    reason: str

    def __post_init__(self) -> None:
        if self.direction not in ("low", "high"):
            raise ValueError(f"direction must be 'low' or 'high', got {self.direction!r}")
        if not 0.0 <= self.fraction < 1.0:
            raise ValueError(f"a relative bias must be in [0, 1), got {self.fraction!r}")


@dataclass(frozen=True)
class Interval:
    """An interval for one output value.

    ``estimate``: the expression at the released measurements (None when it is NULL there);
    ``noise_lower``/``noise_upper``: the interval for the noise alone; ``lower``/``upper``: that
    interval widened by every bias in ``bias`` (equal to the noise bounds when there is none).
    Ends may be infinite (``bounded`` is False): see ``notes`` for why.  ``method`` is "exact"
    (one measurement's own error bound) or "simulation" (``draws`` parametric draws).
    """

    estimate: float | None
    lower: float
    upper: float
    noise_lower: float
    noise_upper: float
    confidence: float
    method: Literal["exact", "simulation"]
    draws: int = 0
    bias: tuple[Bias, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def bounded(self) -> bool:
        """True when both ends of the interval are finite."""
        return math.isfinite(self.lower) and math.isfinite(self.upper)

    @property
    def half_width(self) -> float:
        """The noise interval's larger side from the estimate (its half-width if symmetric), so
        ``estimate +- half_width`` contains it; half its length when the estimate is NULL."""
        if self.estimate is None:
            return (self.noise_upper - self.noise_lower) / 2.0
        return max(self.estimate - self.noise_lower, self.noise_upper - self.estimate)


@dataclass(frozen=True)
class NoInterval:
    """No interval can be given for this output; ``reason`` says why."""

    reason: str


# -- interval arithmetic over arrays ------------------------------------------------------------


class _Refused(Exception):
    """The expression holds something the evaluator cannot bound honestly."""


@dataclass(frozen=True)
class _Box:
    """Per draw, an interval [lo, hi] holding the value; NaN never stored (see ``_box``)."""

    lo: np.ndarray
    hi: np.ndarray


@dataclass(frozen=True)
class _Truth:
    """Per draw, whether a condition may be true and whether it may be false."""

    maybe_true: np.ndarray
    maybe_false: np.ndarray


def _box(lo: np.ndarray, hi: np.ndarray) -> _Box:
    # An undefined end (inf - inf, 0 * inf, ...) becomes the widest one: conservative.
    return _Box(np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi))


def _const(value: float) -> _Box:
    arr = np.asarray(float(value))
    return _Box(arr, arr)


def _corners(a: _Box, b: _Box, op: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> _Box:
    """The range of ``op`` over the box a x b, for ``op`` monotone in each argument there."""
    xs = (a.lo,) if a.lo is a.hi else (a.lo, a.hi)
    ys = (b.lo,) if b.lo is b.hi else (b.lo, b.hi)
    values = [op(x, y) for x in xs for y in ys]
    if len(values) == 1 and not np.isnan(values[0]).any():
        return _Box(values[0], values[0])  # two points: one point, kept shared (cheaper later)
    lo, hi = values[0], values[0]
    for v in values[1:]:
        # np.minimum/np.maximum propagate NaN: an undefined corner (0 * inf, inf / inf) widens
        # its end to infinity in _box instead of being skipped.
        lo, hi = np.minimum(lo, v), np.maximum(hi, v)
    return _box(lo, hi)


def _mul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # 0 times an unbounded end is 0: the end stands for "some finite value, however large".
    with np.errstate(invalid="ignore"):
        return np.where((x == 0) | (y == 0), 0.0, x * y)


def _monotone(a: _Box, f: Callable[[np.ndarray], np.ndarray]) -> _Box:
    with np.errstate(all="ignore"):
        return _box(f(a.lo), f(a.hi))


def _abs(a: _Box) -> _Box:
    lo = np.where(a.lo >= 0, a.lo, np.where(a.hi <= 0, -a.hi, 0.0))
    return _Box(lo, np.maximum(np.abs(a.lo), np.abs(a.hi)))


def _round_half_away(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


_INTEGER_TYPES = (exp.DType.TINYINT, exp.DType.SMALLINT, exp.DType.MEDIUMINT, exp.DType.INT,
                  exp.DType.BIGINT, exp.DType.INT128, exp.DType.UTINYINT, exp.DType.USMALLINT,
                  exp.DType.UINT, exp.DType.UBIGINT)
# FLOAT is also REAL (single precision): its rounding, below 1e-7 relative, is ignored.
_REAL_TYPES = (exp.DType.DOUBLE, exp.DType.FLOAT)
_DECIMAL_TYPES = (exp.DType.DECIMAL, exp.DType.BIGDECIMAL)
# DuckDB's DECIMAL without parameters is DECIMAL(18, 3); Postgres' NUMERIC keeps every digit.
_DEFAULT_DECIMAL_SCALE = 3


class _Evaluator:
    """Evaluates an output expression over boxes of shape (rows, draws).

    ``point`` marks the evaluation of the released values themselves (zero-width boxes): ROUND
    and DECIMAL casts then round half away from zero, as DuckDB does, instead of enclosing both
    tie rules, and the division rule (which needs a distribution) is skipped.
    """

    def __init__(self, env: Mapping[str, _Box], shape: tuple[int, int], ranks: tuple[int, int],
                 point: bool) -> None:
        self.env = env
        self.shape = shape
        self.rank_lo, self.rank_hi = ranks
        self.point = point
        self.unbounded: np.ndarray | None = None  # per row: a denominator reaches 0

    # -- numbers ----------------------------------------------------------------------------
    def value(self, node: exp.Expr) -> _Box:
        if isinstance(node, exp.Paren):
            return self.value(node.this)
        if isinstance(node, exp.Column):
            if node.table or node.name not in self.env:
                raise _Refused(f"it reads {node.sql()}, which is neither a measurement nor a "
                               "numeric group key")
            return self.env[node.name]
        if isinstance(node, exp.Literal):
            if node.is_string:
                raise _Refused("it holds a string constant")
            return _const(float(node.name))
        if isinstance(node, exp.Neg):
            a = self.value(node.this)
            return _Box(-a.hi, -a.lo)
        if isinstance(node, exp.Add | exp.Sub):
            a, b = self.value(node.this), self.value(node.expression)
            with np.errstate(invalid="ignore"):
                if isinstance(node, exp.Add):
                    return _box(a.lo + b.lo, a.hi + b.hi)
                return _box(a.lo - b.hi, a.hi - b.lo)
        if isinstance(node, exp.Mul):
            return _corners(self.value(node.this), self.value(node.expression), _mul)
        if isinstance(node, exp.Div):
            return self._divide(node)
        if isinstance(node, exp.Mod):
            a, b = self.value(node.this), self.value(node.expression)
            if not (_fixed(a) and _fixed(b)):
                raise _Refused("it takes a modulo of a noisy value, which has no meaningful "
                               "interval")
            with np.errstate(all="ignore"):
                r = np.fmod(a.lo, b.lo)  # SQL %: the sign of the dividend, like C fmod
            return _box(np.where(b.lo == 0, np.nan, r), np.where(b.lo == 0, np.nan, r))
        if isinstance(node, exp.Abs):
            return _abs(self.value(node.this))
        if isinstance(node, exp.Sign):
            return _monotone(self.value(node.this), np.sign)
        if isinstance(node, exp.Floor | exp.Ceil):
            return _monotone(self.value(node.this),
                             np.floor if isinstance(node, exp.Floor) else np.ceil)
        if isinstance(node, exp.Round):
            return self._round(node)
        if isinstance(node, exp.Sqrt):
            a = self.value(node.this)
            # The truth is in the domain (else its SQL would fail): only [0, hi] can hold it.
            with np.errstate(invalid="ignore"):
                return _box(np.sqrt(np.maximum(a.lo, 0.0)),
                            np.where(a.hi < 0, np.nan, np.sqrt(np.maximum(a.hi, 0.0))))
        if isinstance(node, exp.Ln):
            return self._log(self.value(node.this), 1.0)
        if isinstance(node, exp.Log):
            if node.expression is None:  # LOG(x) is base 10 in DuckDB and Postgres
                return self._log(self.value(node.this), math.log(10.0))
            base = self.value(node.this)
            if not _fixed(base) or not np.all((base.lo > 0) & (base.lo != 1)):
                raise _Refused("it takes a logarithm whose base is noisy or not a valid base")
            return self._log(self.value(node.expression), np.log(base.lo))
        if isinstance(node, exp.Exp):
            return _monotone(self.value(node.this), np.exp)
        if isinstance(node, exp.Pow):
            return self._power(self.value(node.this), self.value(node.expression))
        if isinstance(node, exp.Least | exp.Greatest):
            parts = [self.value(node.this)] + [self.value(e) for e in node.expressions]
            pick = np.minimum if isinstance(node, exp.Least) else np.maximum
            lo, hi = parts[0].lo, parts[0].hi
            for p in parts[1:]:
                lo, hi = pick(lo, p.lo), pick(hi, p.hi)
            return _Box(lo, hi)
        if isinstance(node, exp.Cast):
            return self._cast(node)
        if isinstance(node, exp.Case):
            return self._case(node)
        if isinstance(node, exp.If):
            return self._branches([(node.this, node.args.get("true"))], node.args.get("false"))
        if isinstance(node, exp.Coalesce):
            # The evaluator never yields NULL (NULLIF is only read as a divisor), so the first
            # argument is the value.
            return self.value(node.this)
        raise _Refused(f"{node.key.upper()} is not an expression the interval evaluator knows")

    def _divide(self, node: exp.Div) -> _Box:
        a = self.value(node.this)
        divisor = node.expression.unnest()
        b = (self._nullif_divisor(divisor) if isinstance(divisor, exp.Nullif)
             else self.value(divisor))
        straddles = (b.lo <= 0) & (b.hi >= 0)
        safe = _Box(np.where(straddles, 1.0, b.lo), np.where(straddles, 1.0, b.hi))
        with np.errstate(divide="ignore", invalid="ignore"):
            q = _corners(a, safe, np.divide)
        lo, hi = np.where(straddles, -np.inf, q.lo), np.where(straddles, np.inf, q.hi)
        if self.point:
            return _Box(lo, hi)
        # The denominator's own 95% range, guards removed: reaching 0 means no bound at all.
        g = self.value(_unguarded(divisor))
        reach = (_order_stat(np.broadcast_to(g.lo, self.shape), self.rank_lo) <= 0) & \
            (_order_stat(np.broadcast_to(g.hi, self.shape), self.rank_hi) >= 0)
        if not reach.any():
            return _Box(lo, hi)
        self.unbounded = reach if self.unbounded is None else self.unbounded | reach
        rows = reach.reshape(-1, 1)
        return _Box(np.where(rows, -np.inf, lo), np.where(rows, np.inf, hi))

    def _nullif_divisor(self, node: exp.Nullif) -> _Box:
        zero = self.value(node.expression)
        if not (_fixed(zero) and np.all(zero.lo == 0)):
            raise _Refused("it uses NULLIF other than to guard a division by 0")
        return self.value(node.this)

    def _round(self, node: exp.Round) -> _Box:
        a = self.value(node.this)
        decimals = node.args.get("decimals")
        digits = 0.0
        if decimals is not None:
            d = self.value(decimals)
            if not _fixed(d) or not float(d.lo).is_integer():
                raise _Refused("it rounds to a noisy number of decimals")
            digits = float(d.lo)
        return self._round_to(a, 10.0**digits)

    def _round_to(self, a: _Box, scale: float) -> _Box:
        with np.errstate(all="ignore"):
            if self.point:
                return _box(_round_half_away(a.lo * scale) / scale,
                            _round_half_away(a.hi * scale) / scale)
            # Enclose both tie rules (half away from zero in DuckDB, half to even for a Postgres
            # double): the lower end rounds ties down, the upper end up.
            return _box(np.ceil(a.lo * scale - 0.5) / scale, np.floor(a.hi * scale + 0.5) / scale)

    def _log(self, a: _Box, divisor: float | np.ndarray) -> _Box:
        # A non-positive argument has no logarithm; the truth is in the domain, as for SQRT.
        with np.errstate(all="ignore"):
            lo = np.where(a.lo <= 0, -np.inf, np.log(np.maximum(a.lo, 0.0)))
            hi = np.where(a.hi <= 0, np.nan, np.log(np.maximum(a.hi, 0.0)))
            if np.all(np.asarray(divisor) > 0):
                return _box(lo / divisor, hi / divisor)
            return _box(hi / divisor, lo / divisor)  # a base below 1 reverses the order

    def _power(self, base: _Box, power: _Box) -> _Box:
        if _fixed(power) and float(power.lo).is_integer():
            return self._integer_power(base, float(power.lo))
        # Elsewhere x**y is only real for x >= 0, and there it is monotone in each argument,
        # so the corners enclose it; a negative base has no real power: no bound for that draw.
        negative = base.lo < 0
        clipped = _Box(np.maximum(base.lo, 0.0), np.maximum(base.hi, 0.0))
        with np.errstate(all="ignore"):
            box = _corners(clipped, power, np.power)
        return _box(np.where(negative & (base.hi < 0), np.nan, box.lo),
                    np.where(negative & (base.hi < 0), np.nan, box.hi))

    def _integer_power(self, base: _Box, p: float) -> _Box:
        with np.errstate(all="ignore"):
            if p >= 0 and p % 2 == 0:  # even: the smallest value is at the point nearest 0
                a = _abs(base)
                return _box(np.power(a.lo, p), np.power(a.hi, p))
            if p > 0:  # odd: increasing
                return _box(np.power(base.lo, p), np.power(base.hi, p))
            # Negative powers: 1 / x**|p|, unbounded when the base can be 0.
            inner = self._integer_power(base, -p)
            straddles = (inner.lo <= 0) & (inner.hi >= 0)
            q = _corners(_const(1.0), inner, np.divide)
            return _box(np.where(straddles, -np.inf, q.lo), np.where(straddles, np.inf, q.hi))

    def _cast(self, node: exp.Cast) -> _Box:
        to = node.to
        a = self.value(node.this)
        if to.this in _REAL_TYPES:
            return a
        if to.this in _INTEGER_TYPES:
            # Both databases cast a double to an integer half to even (rint), which is monotone.
            return _monotone(a, np.rint)
        if to.this in _DECIMAL_TYPES:
            params = to.expressions
            if params:
                scale = float(params[1].this.name) if len(params) > 1 else 0.0
                return self._round_to(a, 10.0**scale)
            # Either database: rounded to 3 decimals (DuckDB) or kept (Postgres); enclose both.
            r = self._round_to(a, 10.0**_DEFAULT_DECIMAL_SCALE)
            return _Box(np.minimum(a.lo, r.lo), np.maximum(a.hi, r.hi))
        raise _Refused(f"it casts to {to.sql()}, which is not a number")

    def _case(self, node: exp.Case) -> _Box:
        if node.this is not None:
            raise _Refused("CASE x WHEN ... is not supported by the interval evaluator")
        return self._branches([(i.this, i.args.get("true")) for i in node.args["ifs"]],
                              node.args.get("default"))

    def _branches(self, ifs: Sequence[tuple[exp.Expr, exp.Expr | None]],
                  default: exp.Expr | None) -> _Box:
        if default is None or any(v is None for _, v in ifs):
            raise _Refused("a CASE without ELSE may be NULL")
        acc = self.value(default)
        for cond, then in reversed(ifs):
            t = self.truth(cond)
            v = self.value(then)  # type: ignore[arg-type]  # checked above
            sure, never = t.maybe_true & ~t.maybe_false, ~t.maybe_true & t.maybe_false
            lo = np.where(sure, v.lo, np.where(never, acc.lo, np.minimum(v.lo, acc.lo)))
            hi = np.where(sure, v.hi, np.where(never, acc.hi, np.maximum(v.hi, acc.hi)))
            acc = _Box(lo, hi)
        return acc

    # -- conditions -------------------------------------------------------------------------
    def truth(self, node: exp.Expr) -> _Truth:
        if isinstance(node, exp.Paren):
            return self.truth(node.this)
        if isinstance(node, exp.Boolean):
            value = np.asarray(bool(node.this))
            return _Truth(value, ~value)
        if isinstance(node, exp.Not):
            t = self.truth(node.this)
            return _Truth(t.maybe_false, t.maybe_true)
        if isinstance(node, exp.And | exp.Or):
            a, b = self.truth(node.this), self.truth(node.expression)
            if isinstance(node, exp.And):
                return _Truth(a.maybe_true & b.maybe_true, a.maybe_false | b.maybe_false)
            return _Truth(a.maybe_true | b.maybe_true, a.maybe_false & b.maybe_false)
        if isinstance(node, exp.Between):
            low = exp.GTE(this=node.this, expression=node.args["low"])
            high = exp.LTE(this=node.this, expression=node.args["high"])
            return self.truth(exp.And(this=low, expression=high))
        if isinstance(node, exp.GT | exp.GTE | exp.LT | exp.LTE | exp.EQ | exp.NEQ):
            a, b = self.value(node.this), self.value(node.expression)
            return _compare(node, a, b)
        raise _Refused(f"{node.key.upper()} is not a condition the interval evaluator knows")


def _compare(node: exp.Expr, a: _Box, b: _Box) -> _Truth:
    if isinstance(node, exp.LT | exp.LTE):
        a, b = b, a  # a < b is b > a
    if isinstance(node, exp.GT | exp.LT):
        return _Truth(a.hi > b.lo, a.lo <= b.hi)
    if isinstance(node, exp.GTE | exp.LTE):
        return _Truth(a.hi >= b.lo, a.lo < b.hi)
    overlap = (a.lo <= b.hi) & (b.lo <= a.hi)
    single = (a.lo == a.hi) & (b.lo == b.hi) & (a.lo == b.lo)
    if isinstance(node, exp.EQ):
        return _Truth(overlap, ~single)
    return _Truth(~single, overlap)


def _fixed(a: _Box) -> bool:
    """True when the box holds one known value in every draw (a constant)."""
    return a.lo.ndim == 0 and bool(a.lo == a.hi)


def _unguarded(node: exp.Expr) -> exp.Expr:
    """The divisor without the guards that only keep SQL defined: GREATEST(d, c > 0), NULLIF(d,
    0), and parentheses; a guard inside arithmetic (VARIANCE's GREATEST(n, 2) - 1) too."""

    def strip(sub: exp.Expr) -> exp.Expr:
        if isinstance(sub, exp.Greatest) and sub.expressions and all(
                isinstance(e, exp.Literal) and not e.is_string and float(e.name) > 0
                for e in sub.expressions):
            return sub.this
        if isinstance(sub, exp.Nullif) and isinstance(sub.expression, exp.Literal) and \
                not sub.expression.is_string and float(sub.expression.name) == 0:
            return sub.this
        return sub

    return node.copy().transform(strip)


def _order_stat(values: np.ndarray, rank: int) -> np.ndarray:
    """Per row (last axis: draws), the ``rank``-th smallest value (1-based)."""
    return np.partition(values, rank - 1, axis=-1)[..., rank - 1]


# -- noise models -------------------------------------------------------------------------------


def _noise(mech: Mechanism, shape: tuple[int, int],
           rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Draws of a mechanism's noise, and the half-width of its rounding box (see module doc)."""
    if isinstance(mech, Snapping):
        return rng.laplace(0.0, mech.scale, shape), mech.Lambda / 2.0
    if isinstance(mech, DiscreteLaplace):
        # The difference of two i.i.d. geometric counts is two-sided geometric with q = e**(-1/b).
        p = -math.expm1(-1.0 / mech.scale)
        g = rng.geometric(p, (2, *shape))
        return (g[0] - g[1]).astype(np.float64), 0.0
    if isinstance(mech, Laplace):
        return rng.laplace(0.0, mech.scale, shape), 0.0
    if isinstance(mech, Gaussian):
        return rng.normal(0.0, mech.scale, shape), 0.0
    raise _Refused(f"no noise model is known for the {mech.name} mechanism")


def draws_for(rows: int, confidence: float = 0.95) -> int:
    """Draws per row for a result of ``rows`` rows: DEFAULT_DRAWS, or fewer so that rows x draws
    stays within WORK_BUDGET, but never below the fewest that leave 5 draws beyond each end
    (199 at 95%).  Fewer draws make the ends noisier, not the coverage lower: the
    order-statistic bound (s - r) / (n + 1) >= confidence holds for every n.

    >>> draws_for(1), draws_for(5000), draws_for(10**6)
    (2000, 400, 199)
    """
    alpha = 1.0 - check_confidence(confidence)
    fewest = max(1, math.floor(10.0 / alpha) - 2)
    while math.floor(alpha / 2.0 * (fewest + 1)) < 5:  # the rank _ranks will use, exactly
        fewest += 1
    return max(fewest, min(DEFAULT_DRAWS, WORK_BUDGET // max(1, rows)))


def _ranks(draws: int, confidence: float) -> tuple[int, int]:
    alpha = 1.0 - confidence
    r = math.floor(alpha / 2.0 * (draws + 1))
    if r < 1:
        raise ValueError(f"{draws} draws are too few for a {confidence:g} interval; use at least "
                         f"{math.ceil(2.0 / alpha) - 1}")
    return r, draws + 1 - r


# -- the public functions -----------------------------------------------------------------------


def output_intervals(
    expr: exp.Expr, released: Mapping[str, Sequence[float] | np.ndarray],
    mechanisms: Mapping[str, Mechanism], *,
    keys: Mapping[str, Sequence[object]] | None = None, confidence: float = 0.95,
    draws: int | None = None, rng: np.random.Generator | None = None,
) -> tuple[Interval | NoInterval, ...]:
    """An interval per released row for the output expression ``expr`` (see the module doc).

    ``released`` maps each measurement id the expression reads to its noisy values, one per
    row; ``mechanisms`` maps it to the mechanism that added the noise (``NoisePlan.mechanisms``).
    ``keys`` maps group-key ids to their values, for expressions that read a key (only numeric
    keys can be used).  ``draws`` per row defaults to :func:`draws_for` the number of rows.
    ``rng`` seeds the simulation (tests); by default fresh OS entropy.
    Raises ``ValueError`` for a measurement without values or mechanism, or rows of unequal
    length: those are caller bugs, not properties of the query.
    """
    conf = check_confidence(confidence)
    used = sorted({c.name for c in expr.find_all(exp.Column) if not c.table}
                  & (set(released) | set(mechanisms)))
    missing = [m for m in used if m not in released or m not in mechanisms]
    if missing:
        raise ValueError(f"measurements {missing} need both released values and a mechanism")
    columns = {m: np.asarray(released[m], dtype=np.float64).reshape(-1) for m in used}
    key_values = dict(keys or {})
    lengths = {c.size for c in columns.values()} | {len(v) for v in key_values.values()}
    if len(lengths) > 1:
        raise ValueError(f"released rows of unequal lengths {sorted(lengths)}")
    n_rows = lengths.pop() if lengths else 1
    if any(np.isnan(c).any() for c in columns.values()):
        raise ValueError("released measurements must not be NaN")
    key_boxes: dict[str, _Box] = {}
    for kid, values in key_values.items():
        try:
            arr = np.asarray([float(v) for v in values], dtype=np.float64)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue  # a non-numeric key: refused below if the expression reads it
        key_boxes[kid] = _Box(arr.reshape(-1, 1), arr.reshape(-1, 1))
    exact = len(used) <= 1
    n_draws = 1 if exact else draws if draws is not None else draws_for(n_rows, conf)
    rank_lo, rank_hi = (1, 1) if exact else _ranks(n_draws, conf)
    generator = rng if rng is not None else np.random.default_rng()
    out: list[Interval | NoInterval] = []
    step = max(1, _CHUNK_ELEMENTS // n_draws)
    try:
        for start in range(0, n_rows, step):
            stop = min(n_rows, start + step)
            chunk = {m: c[start:stop].reshape(-1, 1) for m, c in columns.items()}
            keys_chunk = {k: _Box(b.lo[start:stop], b.hi[start:stop])
                          for k, b in key_boxes.items()}
            out += _chunk(expr, chunk, keys_chunk, mechanisms, conf, exact, n_draws,
                          (rank_lo, rank_hi), generator)
    except _Refused as why:
        return tuple(NoInterval(f"no interval: {why}") for _ in range(n_rows))
    return tuple(out)


def _chunk(expr: exp.Expr, values: Mapping[str, np.ndarray], keys: Mapping[str, _Box],
           mechanisms: Mapping[str, Mechanism], confidence: float, exact: bool, n_draws: int,
           ranks: tuple[int, int], rng: np.random.Generator) -> list[Interval]:
    rows = next(iter(values.values())).shape[0] if values else \
        next(iter(keys.values())).lo.shape[0] if keys else 1
    point_env = {**keys, **{m: _Box(v, v) for m, v in values.items()}}
    point = _Evaluator(point_env, (rows, 1), (1, 1), point=True).value(expr)
    estimate = np.broadcast_to(point.lo, (rows, 1))[:, 0]
    is_point = np.broadcast_to((point.lo == point.hi) & np.isfinite(point.lo), (rows, 1))[:, 0]
    env: dict[str, _Box] = dict(keys)
    for m, y in values.items():
        mech = mechanisms[m]
        if exact:
            t = mech.error_bound(confidence)
            env[m] = _Box(y - t, y + t)
        else:
            e, half = _noise(mech, (rows, n_draws), rng)
            centre = y - e
            env[m] = _Box(centre - half, centre + half) if half else _Box(centre, centre)
    evaluator = _Evaluator(env, (rows, n_draws), ranks, point=False)
    box = evaluator.value(expr)
    lo = np.broadcast_to(box.lo, (rows, n_draws))
    hi = np.broadcast_to(box.hi, (rows, n_draws))
    lower, upper = _order_stat(lo, ranks[0]), _order_stat(hi, ranks[1])
    unbounded = evaluator.unbounded
    method: Literal["exact", "simulation"] = "exact" if exact else "simulation"
    result = []
    for i in range(rows):
        notes = (UNBOUNDED_DENOMINATOR,) if unbounded is not None and unbounded[i] else ()
        est = float(estimate[i]) if is_point[i] else None
        lo_i, hi_i = float(lower[i]), float(upper[i])
        if est is not None:  # the enclosure holds the released value (rounding-safe)
            lo_i, hi_i = min(lo_i, est), max(hi_i, est)
        result.append(Interval(est, lo_i, hi_i, lo_i, hi_i, confidence, method,
                               0 if exact else n_draws, notes=notes))
    return result


def output_interval(
    expr: exp.Expr, released: Mapping[str, float], mechanisms: Mapping[str, Mechanism], *,
    keys: Mapping[str, object] | None = None, confidence: float = 0.95,
    draws: int | None = None, rng: np.random.Generator | None = None,
) -> Interval | NoInterval:
    """The interval of one output value: :func:`output_intervals` for a single row."""
    (result,) = output_intervals(
        expr, {m: [v] for m, v in released.items()}, mechanisms,
        keys={k: [v] for k, v in (keys or {}).items()}, confidence=confidence, draws=draws,
        rng=rng)
    return result


# -- post-processing ----------------------------------------------------------------------------


def clamp_count(value: float) -> int:
    """A released count as users expect it: rounded to an integer and at least 0.

    >>> clamp_count(-305), clamp_count(41.6)
    (0, 42)
    """
    if not math.isfinite(value):
        raise ValueError(f"a count must be finite, got {value!r}")
    return max(0, int(_round_half_away(np.asarray(float(value)))))


def postprocessed(iv: Interval, *, lower: float | None = 0.0, upper: float | None = None,
                  integral: bool = False) -> Interval:
    """``iv`` after the same clamp to [lower, upper] (and rounding) as the released value.

    Valid when the truth itself lies in [lower, upper] (and is an integer when ``integral``):
    a count in [0, inf), an AVG in its declared bounds.  Then the clamped interval holds the
    truth whenever ``iv`` does, and integer ends are rounded inwards (the truth is an integer).
    """
    lo_bound = -math.inf if lower is None else lower
    hi_bound = math.inf if upper is None else upper
    if lo_bound > hi_bound:
        raise ValueError(f"empty clamp range [{lo_bound}, {hi_bound}]")

    def clamp(x: float) -> float:
        return min(max(x, lo_bound), hi_bound)

    def ends(lo: float, hi: float) -> tuple[float, float]:
        lo, hi = clamp(lo), clamp(hi)
        if integral:
            inner = (math.ceil(lo) if math.isfinite(lo) else lo,
                     math.floor(hi) if math.isfinite(hi) else hi)
            # No integer inside: the interval missed; keep it (rounded outwards) rather than
            # invent one.
            return (float(inner[0]), float(inner[1])) if inner[0] <= inner[1] else (
                float(math.floor(lo)), float(math.ceil(hi)))
        return lo, hi

    est = iv.estimate
    if est is not None:
        est = clamp(est)
        if integral:
            est = float(_round_half_away(np.asarray(est)))
    noise_lo, noise_hi = ends(iv.noise_lower, iv.noise_upper)
    lo, hi = ends(iv.lower, iv.upper)
    return replace(iv, estimate=est, lower=min(lo, noise_lo), upper=max(hi, noise_hi),
                   noise_lower=noise_lo, noise_upper=noise_hi)


def with_bias(iv: Interval, bias: Bias) -> Interval:
    """``iv`` widened on one side so it also holds the truth under ``bias``.

    "Low by up to f": the measured value v satisfies v >= T - f |T| for the truth T.  T -> T -
    f |T| is increasing (f < 1), so v <= upper gives T <= upper / (1 - f) for upper >= 0 and T
    <= upper / (1 + f) below 0.  "High by up to f" mirrors it on the lower end.  Whenever the
    noise interval holds v and the bias bound holds, the widened interval holds T.
    """
    f = bias.fraction
    lo, hi = iv.lower, iv.upper
    if bias.direction == "low":
        hi = hi / (1.0 - f) if hi >= 0 else hi / (1.0 + f)
    else:
        lo = lo / (1.0 + f) if lo >= 0 else lo / (1.0 - f)
    return replace(iv, lower=lo, upper=hi, bias=(*iv.bias, bias))


# -- presentation -------------------------------------------------------------------------------


def _decimals(width: float) -> int:
    """Decimals that show ``width`` to two significant digits (0 for widths of 10 or more)."""
    if not math.isfinite(width) or width <= 0:
        return 0
    return max(0, 1 - math.floor(math.log10(width)))


def _number(x: float, decimals: int) -> str:
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    text = f"{x:,.{decimals}f}"
    return text[1:] if text.startswith("-") and not set(text[1:]) - {"0", ".", ","} else text


def _percent(fraction: float) -> str:
    pct = 100.0 * fraction
    return f"{pct:.2g}%" if pct < 10 else f"{pct:.0f}%"


def format_interval(iv: Interval | NoInterval) -> str:
    """The value with its error bar for ``chorus query``.

    >>> iv = Interval(5112.0, 4972.0, 5252.0, 4972.0, 5252.0, 0.95, "exact")
    >>> format_interval(with_bias(iv, Bias("low", 0.03, "trips above the cap")))
    '5,112 ± 140 (noise), up to 3% low (trips above the cap)'
    """
    if isinstance(iv, NoInterval):
        return iv.reason
    minus = None if iv.estimate is None else iv.estimate - iv.noise_lower
    plus = None if iv.estimate is None else iv.noise_upper - iv.estimate
    if iv.estimate is None or minus is None or plus is None:
        d = _decimals((iv.noise_upper - iv.noise_lower) / 2.0)
        text = f"NULL (95% interval {_number(iv.noise_lower, d)} to {_number(iv.noise_upper, d)})"
    elif not (math.isfinite(minus) and math.isfinite(plus)):
        d = _decimals(min(abs(minus), abs(plus)) if math.isfinite(min(minus, plus)) else 0.0)
        text = f"{_number(iv.estimate, d)}, no error bound"
    else:
        small = min(minus, plus) if min(minus, plus) > 0 else max(minus, plus)
        ends = (iv.estimate, iv.noise_lower, iv.noise_upper)
        # Integer ends (counts) need no decimals; otherwise two significant digits of the width.
        d = 0 if all(float(v).is_integer() for v in ends) else _decimals(small)
        if abs(minus - plus) <= 0.05 * max(minus, plus):
            text = f"{_number(iv.estimate, d)} ± {_number(max(minus, plus), d)} (noise)"
        elif minus == 0 or plus == 0:  # clamped at a bound: one side only
            side = f"+{_number(plus, d)}" if minus == 0 else f"-{_number(minus, d)}"
            text = f"{_number(iv.estimate, d)} {side} (noise)"
        else:
            text = (f"{_number(iv.estimate, d)} -{_number(minus, d)}/+{_number(plus, d)} "
                    "(noise)")
    parts = [text]
    parts += [f"up to {_percent(b.fraction)} {b.direction} ({b.reason})" for b in iv.bias]
    parts += list(iv.notes)
    return ", ".join(parts)
