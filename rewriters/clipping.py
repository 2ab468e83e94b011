"""Clipping: every summed value is forced into its declared [lower, upper] by the database."""

from __future__ import annotations

from sqlglot import exp


def clipping(value: exp.Expr, lower: float, upper: float) -> exp.Expr:
    """Return ``LEAST(GREATEST(value, lower), upper)``.

    >>> from sqlglot import parse_one
    >>> clipping(parse_one("t.fare"), 0, 200).sql()
    'LEAST(GREATEST(t.fare, 0), 200)'
    """
    if lower > upper:
        raise ValueError("lower must be <= upper")
    low = exp.Greatest(this=value.copy(), expressions=[_number(lower)])
    return exp.Least(this=low, expressions=[_number(upper)])


def _number(value: float) -> exp.Expr:
    literal = exp.Literal.number(int(value) if float(value).is_integer() else value)
    return exp.Neg(this=exp.Literal.number(-value)) if value < 0 else literal
