"""Neutralise row-level expressions that could fail on some values.

An error raised by one row would tell the analyst that row exists, whatever the noise.  Two
rewrites close the arithmetic routes the analyser lets through:

- every division and modulo gets ``NULLIF(denominator, 0)`` (NULL instead of a division-by-zero
  error, as DuckDB already does), and
- integer-typed operands of +, -, *, /, unary minus and ABS (columns, literals, CASE results) are
  cast to DOUBLE, so no result can overflow a BIGINT.  (Modulo keeps its integers: it cannot
  overflow once its divisor is not zero, and Postgres has no modulo on doubles.)

Types come from the analyser's ``annotate_types`` pass; nodes without a type are left alone.
"""

from __future__ import annotations

from sqlglot import exp

from analyses.typecheck import is_integer

_WIDENED = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Abs)


def safety(node: exp.Expr) -> exp.Expr:
    """Return a copy of ``node`` with guarded divisions and overflow-free integer arithmetic.

    >>> from sqlglot import parse_one
    >>> safety(parse_one("a / b + n % 2")).sql()
    'a / NULLIF(b, 0) + n % NULLIF(2, 0)'
    """

    def visit(sub: exp.Expr) -> exp.Expr:
        if isinstance(sub, exp.Div | exp.Mod) and not _is_guarded(sub.expression):
            sub.set("expression", exp.Nullif(this=sub.expression, expression=exp.Literal.number(0)))
        if isinstance(sub, _WIDENED):
            for key in ("this", "expression"):
                operand = sub.args.get(key)
                if operand is not None and is_integer(operand):
                    sub.set(key, exp.cast(operand, exp.DType.DOUBLE))
        return sub

    return node.copy().transform(visit, copy=False)


def _is_guarded(node: exp.Expr) -> bool:
    return isinstance(node, exp.Nullif) or (
        isinstance(node, exp.Greatest) and isinstance(node.expressions[0], exp.Literal)
        and float(node.expressions[0].name) > 0
    )
