"""Neutralise row-level expressions that could fail on some values.

An error raised by one row would tell the analyst that row exists, whatever the noise.  Two
rewrites close the arithmetic routes the analyser lets through:

- every division and modulo gets ``NULLIF(denominator, 0)`` (NULL instead of a division-by-zero
  error, as DuckDB already does), and
- integer columns inside arithmetic are cast to DOUBLE, so no product can overflow a BIGINT.
"""

from __future__ import annotations

from collections.abc import Container

from sqlglot import exp

_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg)


def safety(node: exp.Expr, integer_columns: Container[str] = ()) -> exp.Expr:
    """Return ``node`` with guarded divisions and overflow-free integer arithmetic.

    >>> from sqlglot import parse_one
    >>> safety(parse_one("a / b + n * 2"), {"n"}).sql()
    'a / NULLIF(b, 0) + CAST(n AS DOUBLE) * 2'
    """

    def visit(sub: exp.Expr) -> exp.Expr:
        if isinstance(sub, exp.Div | exp.Mod) and not _is_guarded(sub.expression):
            sub.set("expression", exp.Nullif(this=sub.expression, expression=exp.Literal.number(0)))
        if isinstance(sub, exp.Column) and sub.name in integer_columns and isinstance(
            sub.parent, _ARITHMETIC
        ):
            return exp.cast(sub, exp.DType.DOUBLE)
        return sub

    return node.copy().transform(visit, copy=False)


def _is_guarded(node: exp.Expr) -> bool:
    return isinstance(node, exp.Nullif) or (
        isinstance(node, exp.Greatest) and isinstance(node.expressions[0], exp.Literal)
        and float(node.expressions[0].name) > 0
    )
