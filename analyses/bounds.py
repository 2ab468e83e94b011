"""Interval arithmetic: the range of a row-level expression from the declared column bounds.

``SUM(fare * 2)`` needs a bound on ``fare * 2``; with ``fare`` in [0, 200] it is [0, 400].
Anything the rules below do not cover has no bound (``None``) and cannot be summed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sqlglot import exp

Interval = tuple[float, float]
ColumnBounds = Callable[[exp.Column], Interval | None]


def expression_bounds(node: exp.Expr, column_bounds: ColumnBounds) -> Interval | None:
    """Return [lo, hi] containing every value ``node`` can take, or None when unknown.

    >>> from sqlglot import parse_one
    >>> expression_bounds(parse_one("fare * 2 - 1"), lambda c: (0.0, 200.0))
    (-1.0, 399.0)
    """
    if isinstance(node, exp.Paren):
        return expression_bounds(node.this, column_bounds)
    if isinstance(node, exp.Column):
        return column_bounds(node)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return None
        value = float(node.this)
        return (value, value)
    if isinstance(node, exp.Neg):
        inner = expression_bounds(node.this, column_bounds)
        return None if inner is None else (-inner[1], -inner[0])
    if isinstance(node, exp.Cast):
        if not node.to.is_type(*exp.DataType.NUMERIC_TYPES):
            return None
        inner = expression_bounds(node.this, column_bounds)
        if inner is not None and node.to.is_type(*exp.DataType.INTEGER_TYPES):
            # A cast to an integer rounds: widen to the enclosing integers.
            return (float(math.floor(inner[0])), float(math.ceil(inner[1])))
        return inner
    if isinstance(node, exp.Abs):
        inner = expression_bounds(node.this, column_bounds)
        if inner is None:
            return None
        lo, hi = inner
        top = max(abs(lo), abs(hi))
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), top)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul):
        left = expression_bounds(node.this, column_bounds)
        right = expression_bounds(node.expression, column_bounds)
        if left is None or right is None:
            return None
        if isinstance(node, exp.Add):
            return (left[0] + right[0], left[1] + right[1])
        if isinstance(node, exp.Sub):
            return (left[0] - right[1], left[1] - right[0])
        products = [a * b for a in left for b in right]
        return (min(products), max(products))
    if isinstance(node, exp.Div):
        left = expression_bounds(node.this, column_bounds)
        right = expression_bounds(node.expression, column_bounds)
        # Only division by a non-zero constant keeps a finite bound.
        if left is None or right is None or right[0] != right[1] or right[0] == 0:
            return None
        ends = [left[0] / right[0], left[1] / right[0]]
        return (min(ends), max(ends))
    if isinstance(node, exp.Least | exp.Greatest):
        parts = [expression_bounds(node.this, column_bounds)] + [
            expression_bounds(a, column_bounds) for a in node.expressions
        ]
        if any(p is None for p in parts):
            return None
        known = [p for p in parts if p is not None]
        pick = min if isinstance(node, exp.Least) else max
        return (pick(p[0] for p in known), pick(p[1] for p in known))
    if isinstance(node, exp.Case):
        branches = [expression_bounds(i.args["true"], column_bounds) for i in node.args["ifs"]]
        default = node.args.get("default")
        if default is not None:
            branches.append(expression_bounds(default, column_bounds))
        if any(b is None for b in branches):
            return None
        known = [b for b in branches if b is not None]
        return (min(b[0] for b in known), max(b[1] for b in known))
    return None
