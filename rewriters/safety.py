"""Neutralise row-level expressions that could fail on some values.

An error raised by one row would tell the analyst that row exists, whatever the noise.  Three
rewrites close the arithmetic routes the analyser (``analyses.totality``) counts on:

- every division and modulo gets ``NULLIF(denominator, 0)`` (NULL instead of a division-by-zero
  error, as DuckDB already does), and
- integer-typed operands of +, -, *, /, unary minus and ABS (columns, literals, CASE results) are
  cast to DOUBLE, so no result can overflow a BIGINT.  (Modulo keeps its integers: it cannot
  overflow once its divisor is not zero, and Postgres has no modulo on doubles.)
- a float column read below arithmetic (+, -, *, /, ROUND) is tamed: a value below
  ``FLOAT_COLUMN_LEAST`` = 1e-150 in magnitude (denormals included) reads as 0, so that a
  product or quotient of non-zero values cannot underflow to 0, and a value beyond ``FLOAT_COLUMN_MOST`` = 1e150 in
  magnitude (+/-Infinity and NaN included) reads as +/-1e150, so that ``fare * 2`` or a
  product of two columns cannot overflow; Postgres reports both as errors.  Declared bounds are
  far inside these limits, so no real value changes.  This is the one place where column
  reads are changed; comparisons and aggregates read the column as it is.
  Likewise a date or timestamp column read under DATE_TRUNC, EXTRACT or a cast is clamped into
  years 1-9999 (``TIME_READ_RANGE``; +/-infinity land on the ends, NULL stays NULL), where
  those functions cannot fail.

Types come from the analyser's ``annotate_types`` pass; nodes without a type are left alone.
"""

from __future__ import annotations

from sqlglot import exp

from analyses.trees import copy_tree
from analyses.typecheck import is_integer

# The domains the rewrite below guarantees; the totality analysis (analyses.totality) assumes
# them of the column reads it tames.

# The least magnitude of a non-zero float column value under arithmetic: this module reads
# smaller ones there as 0, so that the product of two such reads (>= 1e-300) stays a normal
# double and cannot underflow, which Postgres reports as an error.
FLOAT_COLUMN_LEAST = 1e-150
# The largest magnitude of a float column read as an operand of arithmetic (TAMED_BY): it
# clamps larger values (and +/-Infinity, NaN) to +/-1e150 there, so that the product
# of two such reads, or one times a literal below 1e158, stays finite: without it a float
# column may hold any double and ``fare * 2`` could overflow, which Postgres reports as an error.
FLOAT_COLUMN_MOST = 1e150
# The parents under which this module tames a float column read (see FLOAT_COLUMN_MOST).
TAMED_BY: tuple[type[exp.Expr], ...] = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Round)

# A date or timestamp column read under a time function (DATE_TRUNC, EXTRACT, a cast) is clamped
# into years 1-9999 first: the types' extremes and +/-infinity make those functions fail on some
# backends (DATE_TRUNC('month', <earliest DuckDB timestamp>) leaves the range).  The totality
# analysis tries the function on both ends of that range.
# What a policy "timestamp" column annotates as (sqlglot's duckdb dialect says TIMESTAMPNTZ).
TIMESTAMP_TYPES = (exp.DType.TIMESTAMP, exp.DType.TIMESTAMPNTZ, exp.DType.DATETIME)
TIME_READ_RANGE = {
    "date": ("0001-01-01", "9999-12-31"),
    "timestamp": ("0001-01-01 00:00:00", "9999-12-31 23:59:59.999999"),
}

_WIDENED = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Abs)
_TIME_FUNCTIONS = (exp.TimestampTrunc, exp.DateTrunc, exp.Extract)


def safety(node: exp.Expr, tame_floats: bool = True) -> exp.Expr:
    """Return a copy of ``node`` with guarded divisions and overflow-free integer arithmetic.

    ``tame_floats=False`` leaves float column reads as they are: sampled sensitivity
    (``analyses.sampling``) tames every numeric read itself, to a narrower range.

    >>> from sqlglot import parse_one
    >>> safety(parse_one("a / b + n % 2")).sql()
    'a / NULLIF(b, 0) + n % NULLIF(2, 0)'
    """

    def visit(sub: exp.Expr) -> exp.Expr:
        if isinstance(sub, _TIME_FUNCTIONS) or (isinstance(sub, exp.Cast) and \
                sub.to.is_type(*exp.DataType.TEMPORAL_TYPES, *exp.DataType.TEXT_TYPES)):
            _clamp_times(sub.expression if isinstance(sub, exp.Extract) else sub.this)
        if tame_floats and isinstance(sub, TAMED_BY):
            for key in ("this", "expression"):
                if sub.args.get(key) is not None:
                    _sanitise_floats(sub.args[key])
        if isinstance(sub, exp.Div | exp.Mod) and not _is_guarded(sub.expression):
            sub.set("expression", exp.Nullif(this=sub.expression, expression=exp.Literal.number(0)))
        if isinstance(sub, _WIDENED):
            for key in ("this", "expression"):
                operand = sub.args.get(key)
                if operand is not None and is_integer(operand):
                    sub.set(key, exp.cast(operand, exp.DType.DOUBLE))
        return sub

    return copy_tree(node).transform(visit, copy=False)


def _is_guarded(node: exp.Expr) -> bool:
    return isinstance(node, exp.Nullif) or (
        isinstance(node, exp.Greatest) and isinstance(node.expressions[0], exp.Literal)
        and float(node.expressions[0].name) > 0
    )


def _sanitise_floats(node: exp.Expr) -> None:
    """Replace, in place, each float column under ``node`` by its tamed read (below 1e-150 as 0,
    magnitudes above FLOAT_COLUMN_MOST, infinities and NaN as +/-FLOAT_COLUMN_MOST)."""
    for col in list(node.find_all(exp.Column)):
        if col.type is None or not col.type.is_type(exp.DType.DOUBLE, exp.DType.FLOAT):
            continue
        # The reads inside carry no type: a second pass leaves them alone.
        plain = col.copy()
        plain.type = None
        least = exp.Literal.number(repr(FLOAT_COLUMN_LEAST))
        most = exp.Literal.number(repr(FLOAT_COLUMN_MOST))
        tiny = exp.LT(this=exp.Abs(this=plain), expression=least)
        # NaN compares above every number on both backends: it reads as +1e150.
        high = exp.GT(this=plain.copy(), expression=most)
        low = exp.LT(this=plain.copy(), expression=exp.Neg(this=most.copy()))
        col.replace(exp.Case(ifs=[exp.If(this=tiny, true=exp.Literal.number("0.0")),
                                  exp.If(this=high, true=most.copy()),
                                  exp.If(this=low, true=exp.Neg(this=most.copy()))],
                             default=plain.copy()))


def _clamp_times(node: exp.Expr) -> None:
    """Replace, in place, a date or timestamp column ``node`` by its clamped read."""
    while isinstance(node, exp.Paren):
        node = node.this
    if not isinstance(node, exp.Column) or node.type is None:
        return
    kind = "date" if node.type.is_type(exp.DType.DATE) else (
        "timestamp" if node.type.is_type(*TIMESTAMP_TYPES) else None)
    if kind is None:
        return
    plain = node.copy()
    plain.type = None  # a second pass leaves the clamped read alone
    lo, hi = (exp.Cast(this=exp.Literal.string(v), to=exp.DataType.build(kind.upper()))
              for v in TIME_READ_RANGE[kind])
    low = exp.If(this=exp.LT(this=plain.copy(), expression=lo), true=lo.copy())
    high = exp.If(this=exp.GT(this=plain.copy(), expression=hi), true=hi.copy())
    node.replace(exp.Case(ifs=[low, high], default=plain))
